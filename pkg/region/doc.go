// Package region federates pdserve deployments in several regions. A
// region is a whole pdserve: its coordinators, its pools and its NATS
// server. Regions federate over a NATS supercluster: each region runs a
// second NATS server that is its gateway (control.StartGateway, mutual
// TLS between the gateways), and the region's own server connects to it
// as a leaf node (control.WithLeafRemote; in the chart, a second
// container in the NATS pod). Only pdserve.region.> crosses that leaf
// link: heartbeats, commands, KV events, plans, replies and JetStream
// stay inside their region, and the region's own server keeps JetStream,
// which nats-server runs only clustered on a server that is itself a
// gateway. No protocol of pdserve's own crosses regions but the OpenAI
// API itself.
//
// Each coordinator publishes a Summary of its region every interval on
// SummarySubject: its name, the URL peers forward to, its models and
// tiers, each model's load (up, shedding, queued prefill tokens) and the
// TTFT terms its router learnt (tiers.Terms), from which a peer predicts
// the region's TTFT for a prompt of its own. A Federation keeps the
// others' summaries (a region not heard from for TTL is gone) and
// measures the round trip to each by a probe on its ping subject, which
// the peer's coordinator answers on the origin's pong subject: the RTT is
// coordinator to coordinator, through the gateways, measured on one
// clock.
//
// Place decides where a request is served: here when this region is up
// and predicted within the request's TTFT budget; otherwise the peers
// whose predicted TTFT plus measured RTT fits, best first, and, when none
// fits, the best peer that beats this region; this region is the last
// resort while it is up. A Forwarder sends the request to a peer over the
// OpenAI API with mutual TLS (the region's certificate, verified against
// the region CA both ways), carrying the client's identity (its API key's
// name, which the origin authenticated and charged) and a hop count:
// a forwarded request is never forwarded again.
//
// Budgets and limits across regions: a peer gets what is left of the
// client's TTFT budget (Request.Left: the client's network term, the time
// spent at the origin and the round trip to the peer taken off), and a
// budget spent before a peer is tried ends the forwarding (Outcome.Spent;
// the origin serves the request) unless the origin cannot serve it at all
// (Request.Fallback). The serving region charges the client's key nothing
// and reports the tokens the request used in the HeaderUsage trailer;
// the Forwarder hands it to Request.OnUsage before the end of the
// response reaches the client, and the origin settles its charge to it.
package region
