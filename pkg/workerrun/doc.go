// Package workerrun runs one pdserve worker (prefill, decode or colocated):
// Options (from flags or code) → Validate → Start: build the engine, serve
// gRPC (PrefillService, or DecodeService and the KV transfer receiver, plus
// grpc.health.v1), serve Prometheus metrics and health probes over HTTP,
// publish heartbeats and take commands on NATS, and run the scheduler →
// block → Stop: drain gracefully.
//
// The worker binaries call Main. The coordinator's standalone mode starts
// workers in its own process with Start, each on "127.0.0.1:0", and stops
// them with Stop:
//
//	o := workerrun.NewDecodeOptions()
//	o.ID, o.GRPCAddr, o.MetricsAddr, o.NATSURL = "decode-0", "127.0.0.1:0", "", natsURL
//	w, err := workerrun.Start(ctx, o, logger)
//	... w.Addr() is the gRPC address to dial ...
//	err = w.Stop(ctx)
//
// # Graceful stop
//
// Stop marks the worker draining (heartbeats say so at once; new Prefill and
// Reserve calls fail with UNAVAILABLE), waits up to Options.DrainTimeout
// for the requests in flight, stops the scheduler (failing what is left with
// UNAVAILABLE), stops gRPC gracefully (forcibly when ctx ends first), drains
// NATS and shuts the HTTP server down. A NATS "drain" command only marks the
// worker draining; the process keeps serving what it has.
//
// # TLS
//
// With --tls-cert and --tls-key (TLSOptions) the gRPC server serves TLS;
// with --tls-ca as well it requires client certificates signed by that CA
// (mutual TLS), and a prefill worker verifies the decode workers it sends
// KV to against it, checking --tls-server-name rather than their IP. No
// TLS flag: plaintext. The certificate is re-read when a connection
// handshakes, so a renewed Secret takes effect without a restart. Package
// tlstest makes throwaway CAs and certificates for tests.
//
// # Commands
//
// On "pdserve.cmd.<id>" the worker takes "drain", "cancel" (RequestID) and,
// on prefill workers, "resend" (RequestID to the decode worker at Arg,
// started in the background; the reply only says it was accepted).
package workerrun
