// Package workerrun runs one pdserve worker (prefill, decode or colocated):
// Options (from flags or code) → Validate → Start: build the engine, serve
// gRPC (PrefillService, or DecodeService and the KV transfer receiver, plus
// grpc.health.v1), serve Prometheus metrics and health probes over HTTP,
// publish heartbeats, the prefix cache's KV events and snapshots
// (--kv-events, control.KVPublisher; without them heartbeats carry a
// truncated digest) and take commands (CmdKVSnapshot among them) on NATS,
// and run the scheduler → block → Stop: drain gracefully.
//
// The worker binaries call Main. The coordinator's standalone mode starts
// workers in its own process with Start, each on "127.0.0.1:0", and stops
// them with Stop:
//
//	o := workerrun.NewDecodeOptions()
//	o.ID, o.GRPCAddr, o.MetricsAddr, o.NATSURL = "decode-0", "127.0.0.1:0", "", natsURL
//	o.NATS = user.ConnOptions() // a control.NATSUser of the embedded server
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
// With --tls-cert and --tls-key (grpcnet.TLSOptions) the gRPC server serves
// TLS; with --tls-ca as well it requires client certificates signed by that CA
// (mutual TLS), and a prefill worker verifies the decode workers it sends
// KV to against it, checking --tls-server-name rather than their IP. No
// TLS flag: plaintext. The certificate is re-read when a connection
// handshakes, so a renewed Secret takes effect without a restart. Package
// tlstest makes throwaway CAs and certificates for tests.
//
// # Who may call
//
// The worker serves its gRPC methods only to the coordinator and KV
// pushes only to prefill workers (Options.GRPCAuth, package grpcauth,
// whose doc has the table of methods and roles):
//
//   - With mutual TLS, --tls-allow-coordinator and --tls-allow-prefill
//     (repeatable or comma-separated; DNS names or URIs such as SPIFFE
//     IDs) name the certificates allowed in each role: a prefill worker's
//     certificate gets PERMISSION_DENIED on Generate or Reserve. Without
//     them (the default) every certificate the CA signed may call
//     everything, which suits one certificate shared by all components.
//   - With or without TLS, --grpc-token-file (the coordinator's token, or
//     its "sha256:<hex>" digest on a worker) and --grpc-prefill-token-file
//     (the prefill workers' token; a prefill worker needs the token itself,
//     a decode worker its digest suffices) require a bearer token in the
//     call's metadata: none or a wrong one is UNAUTHENTICATED, another
//     role's PERMISSION_DENIED. Without a prefill token, the coordinator's
//     is shared by both roles.
//   - Neither: everyone may call, as before; the worker warns at start
//     that its gRPC is open.
//
// Refusals are logged without secrets. A decode worker also caps what
// each caller (grpcauth.Caller: its authenticated identity, else its IP)
// holds: --max-reservations-per-caller (default 4096 requests) and
// --max-reserved-tokens-per-caller (default 4194304 tokens); over a cap
// Reserve and Generate fail with RESOURCE_EXHAUSTED.
//
// # Keepalive
//
// Every gRPC connection the worker serves or dials is pinged after
// --grpc-keepalive-time without traffic (default 10s; gRPC clients ping
// at most every 10s) and closed when the ping is not answered within
// --grpc-keepalive-timeout (default 5s), also with no call open, so that
// a hung or vanished peer fails its calls with UNAVAILABLE within
// seconds (grpcnet.KeepaliveOptions, which the coordinator shares). A
// prefill worker closes its KV connections to a decode worker that no
// transfer used for kvtransfer.DefaultIdleTimeout (5 min).
//
// # NATS
//
// The worker logs in to NATS with Options.NATS (control.ConnOptions:
// --nats-user and --nats-password-file, --nats-token-file,
// --nats-nkey-seed-file or --nats-creds, and --nats-tls-ca,
// --nats-tls-cert, --nats-tls-key). Start does not wait for NATS: the
// connection is retried in the background, forever, with backoff (also
// after a refused login, which is logged without the secret), and
// reconnects the same way after a disconnect. Until it is connected the
// worker publishes no heartbeats and /readyz answers 503 ("not connected
// to NATS"); gRPC serves meanwhile. A bad credential file (missing,
// empty) fails Start at once.
//
// # Commands
//
// On "pdserve.cmd.<role>.<id>" the worker takes "drain", "cancel"
// (RequestID) and, on prefill workers, "resend" (RequestID to the decode
// worker at Arg, started in the background; the reply only says it was
// accepted). On an authenticated server only the coordinator's user may
// publish there.
//
// # Elastic workers
//
// A worker started with Options.Elastic (--elastic) also takes "role" (Arg: prefill,
// decode or colocated; ChangeRole): it changes role without reloading its
// model. The old role drains first: its heartbeats say draining at once,
// new work for it fails with UNAVAILABLE (the coordinator retries it on
// another worker), prefills in progress finish and deliver their KV and
// running decode sequences finish, for at most DrainTimeout. Then its
// server stops (freeing the KV of what it left) and the
// new role's server starts on the same engine, gRPC listener and NATS
// connection; the next heartbeat, on the new role's subject, carries
// the new role, and the command subscription moves to it. The gRPC server
// serves the services of every role from the start (grpc takes no
// registration once it serves) and hands each call to the current
// role's server; another role's calls get UNAVAILABLE. Its logs carry
// the role it has now; pdserve_worker_role{role} is 1 for it,
// pdserve_worker_role_changes_total{from,to} counts the changes and
// pdserve_worker_role_change_first_request_seconds{role} is the time from
// the command to the first call served in the new role. Its NATS user
// has control.RoleElastic's permissions (every worker role's subjects
// for its id); its gRPC credentials must be those of a prefill worker
// too, since it sends KV as one, and with TLS its certificate must name
// an identity its peers accept as the server of either role (the chart
// gives the pool an identity of its own, elastic, in every worker's
// --tls-allow-prefill and --tls-worker-identity for both roles); it
// verifies its own peers with --tls-worker-identity, which every role
// takes. Running decode sequences finish on the
// old role, or, when the command says Migrate, move with their KV to
// other decode workers (decode.Server.MigrateAll), on which the
// coordinator resumes their streams. The prefix cache's engine tier is
// handed to the new role's batch (prefixcache.Handover: no KV copied;
// provenance tags kept, and unverified pulled KV is never cached), which
// counts it against the engine's memory as its own and publishes it in
// its KV events and digest under the new role: the router finds the
// worker's cached prefixes again once its view of the worker, which it
// resets on the new role and KV event epoch, has the new snapshot. The
// host and disk tiers go along too (their KV not copied, the disk tier's
// files renamed into the new tier's directory) when the new role's cache
// has such tiers; a decode role has no host tier by default
// (--host-cache-bytes), and then drops them.
package workerrun
