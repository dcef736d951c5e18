// Package control is pdserve's control plane on NATS: workers publish
// heartbeats, the coordinator keeps a membership view from them, and
// commands (drain, cancel, resend) go to one worker by request/reply. Bulk
// data (KV) never goes over NATS; see package kvtransfer.
//
// # Subjects and payloads
//
// Every payload but the KV events' is JSON (UTF-8, field names in lower snake case, times in
// RFC 3339 with nanoseconds), so any NATS client can read and write them:
//
//	pdserve.hb.<role>.<id>    Heartbeat, published by a worker every interval
//	pdserve.cmd.<role>.<id>   Command, request/reply; the reply is a CommandReply
//	pdserve.plan              planner decisions (payload defined by the planner)
//	pdserve.kv.<role>.<id>    KV events and snapshots of the worker's prefix cache (binary, see below)
//
// Worker ids and roles must be valid single NATS subject tokens: not empty,
// no '.', '*', '>' or white space (ValidToken). Both are in each subject
// so that NATS permissions can name one worker, or one role.
//
// # Membership
//
// Membership is a deterministic core: it never reads the clock; callers
// pass the time of every observation and expiry. A member whose last
// heartbeat was observed more than the TTL ago is removed by Expire. Members
// lists live members of a role, draining ones excluded; Models lists the
// models they serve, each with the smallest context length (MaxSeqLen) its
// workers report. Watch wires a Membership to NATS and expires on a ticker;
// it refuses (and logs, WatchLogger) a heartbeat whose id or role differs
// from its subject's.
//
// # KV events
//
// A worker's KVPublisher tells the coordinator every block hash its prefix
// cache stores and removes (a prefixcache.Observer), batched every 50 ms
// or 4096 hashes, each batch with the next number of a per-worker
// sequence, and a full snapshot (every block, with the number of the last
// batch it includes) at start, every --kv-snapshot-interval and on
// CmdKVSnapshot. The payload is binary (kvevents.go): a header (version,
// kind, the publisher's random epoch, the sequence number), then runs of
// stored or removed uint64 hashes, or a snapshot part's hashes (a
// snapshot is cut into parts below the server's payload limit). The
// coordinator's KVIndex (fed by WatchKV) applies batches in sequence; a
// gap marks the worker's view stale, asks the worker for a snapshot
// (once per gap) and heals at the snapshot; a new epoch (a restarted
// worker) starts over; a worker gone from the membership loses its view.
//
// The index is bounded whatever the workers send (KVIndexOptions): only
// admitted ids are indexed (with RequireAdmission, those the coordinator
// verified: by certificate under TLS), others' payloads are dropped
// unread; a snapshot's parts are checked against the worker's cap and
// memory grows only as hashes arrive; one worker's views hold at most
// WorkerMaxBytes (the rest left out), all workers' MaxBytes (beyond it
// the worker holding the most gives way), at KVIndexEntryBytes a block.
// WatchKV sorts payloads into one bounded queue per worker, so a worker
// that floods its subject loses its own payloads, never another's.
// Membership's MaxPending bounds the ids awaiting admission, so that
// heartbeats under forged ids grow no state without bound.
//
// # Authentication and permissions
//
// NATS requires credentials. The server side is NATSUser: a user name and
// password (plain or bcrypt) or a public NKey, a role, and optionally the
// one worker id the user may act as; Permissions derives what it may do:
//
//	coordinator  publish pdserve.cmd.>, pdserve.plan; subscribe pdserve.hb.>, pdserve.kv.>, pdserve.plan, _INBOX.>
//	observer     publish nothing; subscribe pdserve.hb.>, pdserve.plan
//	worker       publish pdserve.hb.<role>.<id>, pdserve.kv.<role>.<id>; subscribe pdserve.cmd.<role>.<id>;
//	             one reply per command received, within a minute
//	prefill      also subscribe pdserve.hb.decode.*, pdserve.hb.colocated.*
//	             (the receivers' codec speeds, Heartbeat.CodecSpeeds)
//	elastic      a worker that changes role (CmdRole): prefill's, decode's
//	             and colocated's permissions together, for its id
//
// Only the coordinator publishes commands and plans. A worker user with an
// id (the standalone coordinator generates one per worker, per start, with
// a crypto/rand password kept in process; a users file may list them too)
// can publish heartbeats under that id alone: a forged heartbeat under
// another worker's id is a permission violation, dropped by the server and
// reported to the publisher asynchronously (its error handler; Connect logs
// it) and logged by the server (WithLogger), naming the subject.
//
// A worker user without an id (<id> is "*") is a credential the replicas of
// a role share, as a Kubernetes Deployment's pods share one Secret. Then:
//   - prevented: publishing commands or plans; heartbeats or command
//     subscriptions of another role; reading heartbeats, plans or other
//     roles' commands (a prefill worker reads decode and colocated
//     heartbeats, nothing else); connecting at all without the credential;
//   - not prevented: a holder publishing heartbeats under any id of its own
//     role, another replica's included (taking over its traffic, or marking
//     it draining), and subscribing to, and answering, the commands of
//     other workers of its role. Core NATS does not tell a subscriber who
//     published a message, so the coordinator cannot bind a heartbeat to a
//     user; it can only rely on the subject, which the publisher's
//     permissions vouch for, and refuse a payload that claims another
//     (Watch). Per-worker users (stable ids, such as a StatefulSet's pod
//     names) close the gap; gRPC authentication between the components
//     limits what a forged address obtains.
//
// Everyone connected to an authenticated server has logged in, so the
// coordinator accepts heartbeats only from authenticated users.
//
// # Connecting
//
// ConnOptions is the client side, shared by the three binaries (AddFlags:
// --nats-user with --nats-password-file, --nats-token-file,
// --nats-nkey-seed-file or --nats-creds; --nats-tls-ca, --nats-tls-cert,
// --nats-tls-key; --nats-reconnect-wait). Secrets come from files only,
// the password and token files are re-read at each (re)connect, and
// LogFields names files, never their content. Connect retries the first
// connection and reconnects forever, with exponential backoff and jitter,
// also after a refused login (credentials may be fixed meanwhile); it
// returns at once, and Publisher publishes nothing while the connection is
// down, so a component can start before its NATS server and join when it
// comes up. RedactURL strips credentials from URLs for logs.
//
// # Embedded server
//
// StartEmbedded runs a nats-server in the process (no signal handlers,
// plaintext), for a coordinator started without a NATS URL and for tests;
// WithUsers makes it require credentials (without it, it accepts anyone:
// tests only), WithLogger logs its refusals. LoadUsers reads a users file
// (YAML) for workers started apart.
package control
