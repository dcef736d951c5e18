// Package coordinator is pdserve's coordinator: it serves the
// OpenAI-compatible API (pkg/frontend), keeps the worker membership from
// NATS heartbeats (pkg/control; an embedded NATS server when no URL is
// given), routes each request (pkg/router) and runs it over the workers'
// gRPC services, recording its latency budget (pkg/budget, pkg/metrics).
//
// Its job is request orchestration. The rest lives elsewhere: the binary's
// flags, subcommands (plan, profiles, calibrate, hash-key) and wiring in
// package coordinatorrun; the online planner and its Kubernetes actuator
// in package plannerhost, attached as an Extension (an observer of the
// traces of completed requests); the classification of KV transfer
// failures in package wire (wire.IsKVTransferFailed); standalone
// mode (--standalone: the workers in this process, the embedded NATS
// server with their users, a generated gRPC key pair) in package standalone,
// which hands the coordinator its workers' tokenizer and registry, its
// shutdown step and an Extension that warns of sim engines falling behind
// their model through the code-only Options Tokenizer, Registry,
// BeforeNATSDrain and Extensions. Start refuses Options with
// Standalone set (ErrStandalone).
//
// # NATS
//
// The embedded server (no --nats-url) requires credentials: the
// coordinator logs in as a coordinator-role user generated per start,
// workers as the users of --nats-auth-file (control.LoadUsers) or
// Options.NATSUsers; package standalone generates a user per in-process
// worker. With --nats-url the coordinator
// logs in with --nats-user/--nats-password-file, --nats-token-file,
// --nats-nkey-seed-file or --nats-creds and --nats-tls-* (control.ConnOptions).
// Either way the connection is retried forever; Ready reports "not
// connected to NATS" (503 on /readyz) until it is up.
//
// # Request flow (disaggregated)
//
//  1. Admission (the frontend, before the body is read): at most
//     Policy.Limits.QueueLimit requests at once; one more gets 429.
//  2. Routing: one Router.Route call, before any Reserve, makes the whole
//     decision: it picks a decode worker among those serving the request's
//     model (every worker under --model-name), decides remote or local
//     prefill, for remote picks the prefill worker, and names the peer the
//     worker that prefills may pull the prompt's prefix from (the deepest
//     holder among every live worker that keeps prompts; see package
//     router). Then the coordinator calls
//     DecodeService.Reserve(prompt + n × max_tokens) on the decode worker
//     (a full worker is excluded and the request routed again, decode and
//     prefill worker both, and so is one that fails, at most 3; when every
//     one is full: 429; when none exists: 503). The router decides on its
//     estimate of the decode worker's prefix cache; the flow revises a
//     remote decision on Reserve's answer (the prompt tokens the worker
//     really holds, pinned until the KV arrives) with the pure
//     router.Revise: when the rest is shorter than routing.local_prefill_below_tokens
//     the prompt prefills on the decode worker, with the decode worker's
//     pull (Router.Revised drops the chosen prefill worker's queued
//     tokens), and otherwise the prefill worker skips the tokens the
//     decode worker holds (PrefillRequest.skip_tokens).
//  3. DecodeService.Generate and PrefillService.Prefill run concurrently.
//     The prefill worker's FirstToken carries the first token; the decode
//     stream carries the rest (its tokens are positional: from the second
//     output token on with remote KV, from the first with local prefill,
//     from after generated_tokens in a recovery). With first-token policy
//     "prefill" the first token goes to the client as soon as the
//     prefill worker reports it; with policy "decode" it goes with the
//     decode stream's first tokens, so the KV transfer is part of TTFT.
//     An end-of-generation token ending a sequence (EOS or another id of
//     engine.EOGTokens of the coordinator's tokenizer) is not sent to the
//     client; a first token that is one is held until the decode stream's
//     finish.
//  4. At the end, on every path (finish, error, client disconnect), both
//     calls are cancelled if still open, DecodeService.Cancel frees a
//     reservation left behind after a failure, and PrefillService.Release
//     drops the prompt's KV retained on the prefill worker.
//
// Colocated mode (and prompts below the local-prefill threshold, and
// requests that want the prompt's log-probabilities: echo with logprobs)
// send Generate with local_prefill and no Prefill call.
//
// # The flow and its shell
//
// One request's decisions (the steps above, the recovery below) are a
// pure state machine, package flow: events in (the router's answer,
// Reserve's, each message and end of the Prefill and Generate streams,
// Resend's result, the client's writes and departure), actions out
// (Route, Reserve, Prefill, Generate, Resend, Cancel, Release, Deliver,
// Record, Fail...). The flow speaks only its own Go types: it links no
// protobuf, gRPC or frontend package (internal/layering checks it).
// backend.go is its shell and edge.go its edge: the shell converts each
// worker message to a flow event and each call's gRPC status to a
// flow.CallError (its code's class, a failed KV transfer, a refused
// grammar), applies the flow's budget records to the request's trace,
// performs the other actions (router and gRPC calls, writes to the
// client) from one goroutine per request, with one goroutine per open
// call feeding events back, and maps a flow.Failure to the client's
// error (below). The shell never re-enters the Machine: it steps one
// event, performs that Step's actions in order, queues the answer of a
// synchronous action (Route, Reserve, Deliver: always a Step's last),
// and steps the queue before it waits for the calls' next event. Its
// scenarios, flow/testdata/*.txt, walk every recovery path and every
// protocol violation step by step.
//
// # What each message carries, and why
//
//   - ReserveRequest: the sizes (prompt + max_tokens, n sequences) and, on
//     a first placement with remote prefill, the prompt, so that the
//     decode worker can answer the prefix it holds (prefix_hit_tokens,
//     pinned until the KV arrives), and keeps it for the Generate call
//     (ReserveResponse.prompt_held). The flow revisits local vs remote on
//     that real hit (router.Revise); a recovery that prefills again
//     shows it the prompt too; a recovery's Reserve that resumes (Resend)
//     and a colocated one send no prompt: the whole retained KV comes, or
//     the worker looks its cache up itself.
//   - PrefillRequest: the prompt, sampling, the decode worker's id and
//     address, the codec, skip_tokens (Reserve's hit: only the rest
//     crosses the wire), a credential for one push to that worker, and
//     the router's pull (peer: a worker holding more of the prompt's
//     prefix, with a credential for one pull of this prompt's chain).
//   - GenerateRequest: the prompt (the decode worker keys its prefix
//     cache on the tokens and prefills them itself when local), unless
//     the worker's Reserve answered prompt_held: then it takes the one it
//     was shown, so the prompt crosses the wire twice (Reserve to the
//     decode worker, Prefill to the prefill worker) rather than three
//     times; a decode worker that predates prompt_held gets it again.
//     Then sampling, max_tokens, n, and in a recovery the tokens each
//     choice already delivered (generated_tokens, generated_choices);
//     with remote KV the deprecated first_token_from_prefill, for decode
//     workers of the previous release (package wire).
//   - PrefillResponse: queued (a budget stamp), first_token (the token the
//     prefill worker sampled, with its stamps, batch, prefix hit and
//     log-probability) and kv_done (the decode worker's ack, relayed).
//   - GenerateResponse: positional tokens of one choice, their
//     log-probabilities, the finish and the decode worker's stamps.
//   - ResendResponse: the kv_done of the re-sent KV.
//
// The first token has one carrier per party, decided by the mode and
// never reconciled (package flow, scenarios flow/testdata/firsttoken.txt):
//
//   - Remote prefill (a first placement, a prefill retry for the same
//     decode worker, a recovery that prefills again): the client's comes
//     from FirstToken, with its log-probability; the decode worker's from
//     the KV commit, which it takes into its sequence but never streams:
//     choice 0's Generate stream starts at position 1. Its messages that
//     come before FirstToken wait for it (nothing else has position 0);
//     a Prefill stream that ends without FirstToken after the decode
//     worker streamed starts the request over on other workers (nothing
//     reached the client). Under policy "decode" FirstToken's token goes
//     out with the decode stream's first tokens.
//   - An end-of-generation first token (without ignore_eos) is held as
//     the decode stream's last token would be: the stream's finish
//     ("stop") ends the choice with it, and a worker that does not end on
//     it makes it output with its next tokens.
//   - Local prefill (colocated, Reserve's real hit, a short prompt,
//     prompt log-probabilities): no prefill stream; the decode stream
//     carries position 0.
//   - A recovery that resumes (Resend, a migration's pull) sends the
//     tokens the client has (generated_tokens) and the stream starts
//     after them; with remote KV and none yet (a held end-of-generation
//     first token, or one waiting under policy "decode"), at position 1
//     as above, FirstToken's token being the flow's already.
//
// "KV done" reaches the flow once: PrefillResponse.kv_done (and
// ResendResponse.kv_done for a re-send), the decode worker's
// PushResponse relayed by the prefill worker. The budget's kv_transfer
// term (prefill end → KV done) and kv_stream (first byte → done) read
// its stamps, which are the decode worker's clock as the decode
// stream's would be, and the request log its bytes raw and on the wire
// and the codec with the reason it was chosen, which only the sender
// knows; the prefill worker needs the ack anyway (it retains the KV
// until then, for Resend); and it tells the flow that a Prefill stream
// breaking afterwards is harmless (no recovery). The decode stream's
// kv_first_byte and kv_done stamps are the decode worker's own record
// (its trace spans, a migration's pull): the coordinator's edge skips
// them, so a later transfer (a migration's pull after a local prefill)
// can no longer pass for the first placement's.
//
// # Choices and log-probabilities
//
// A request of n choices is one Generate call with n set: the decode
// worker forks the prompt's KV into n sequences (engine.Forker), so the
// prompt is prefilled and transferred once. Its events carry the choice
// index; the coordinator keeps each choice's delivered tokens, held-back
// end-of-generation token and finish, and hands the frontend each
// choice's tokens with their log-probabilities (frontend.Output). With
// remote prefill the first token's log-probability is FirstToken's. A
// stop string ends one choice: its later tokens are dropped, and once
// every choice ended the calls are cancelled and the workers' KV freed
// as after an error. A recovery sends each choice's delivered tokens
// (generated_tokens, generated_choices).
//
// # Errors
//
// No worker's error text reaches a client. The flow ends a request it
// fails with a flow.Failure{Kind, Part, Cause}; edge.go (clientError)
// alone maps its Kind to a frontend.Error with a message of the
// coordinator's own: a worker's refusal by its code's class (invalid:
// INVALID_ARGUMENT, OUT_OF_RANGE 400; full: RESOURCE_EXHAUSTED 429;
// unavailable 503), no decode worker with KV room 429, every prefill
// queue full 429, no worker for the model 503, a failed recovery 503.
// The Cause (the worker's status) is kept for the request log. Other
// failures (a protocol violation, a worker's other refusal) are a 500
// whose message names only the request id.
//
// # Decode-worker failure
//
// When a Generate stream breaks (UNAVAILABLE, ABORTED, CANCELED not asked
// for, INTERNAL, UNKNOWN, DEADLINE_EXCEEDED) the coordinator waits for the
// Prefill stream to end, reserves on another decode worker (before
// anything may send KV to it), opens Generate there with generated_tokens
// set to the tokens the client already has, and gets the KV to it: when
// the prompt was prefilled, the prefill worker Resends its retained copy;
// when the KV never completed (the decode worker failed while the prompt
// was queued or being prefilled, so the transfer to it failed and nothing
// was retained), the prompt is routed and prefilled again for the new
// worker. With local prefill the new worker prefills itself. Greedy output
// is unchanged.
//
// A Prefill (or Resend) whose KV transfer to the decode worker failed
// (wire.IsKVTransferFailed: the worker is unreachable, lost the request,
// or broke the transfer off) is a failure of that decode worker too, even
// while its Generate stream is still open: a decode worker waits for KV as
// long as its call lasts, so the coordinator ends that call and recovers
// as above. A transfer the decode worker refused as malformed ends the
// request with the worker's error. A prefill worker's refusal
// (RESOURCE_EXHAUSTED: its queue is full) is a 429 with Retry-After.
//
// When no worker can take the request or the KV is gone, the client gets
// a clear error (an error event once the stream started). At most 3
// failovers per request.
//
// # TLS, gRPC credentials and admission
//
// Options.TLS (--tls-cert, --tls-key, --tls-ca, --tls-server-name) makes
// the gRPC connections to the workers TLS: the CA verifies the workers'
// certificates (for --tls-server-name rather than the heartbeat's IP) and
// the certificate is presented to workers that require client
// certificates (mutual TLS). Each connection belongs to one worker (its
// heartbeat's id, role and address) and its handshake refuses a
// certificate that does not name that role and id
// (--tls-worker-identity, grpcauth.WorkerIdentity), before any call.
// Standalone workers (package standalone) get the same settings. No TLS
// flag: plaintext.
//
// Options.GRPCAuth (pkg/grpcauth): with --grpc-signing-key the
// coordinator signs a credential per call, bound to the worker's id, the
// method and a short expiry, and hands the prefill worker of each request
// a credential for one KV push to its decode worker (PrefillRequest and
// ResendRequest decode_credential); workers hold only the public key.
// A static token (--grpc-token-file) is sent on every call instead,
// which over plaintext goes to any address a heartbeat names (the
// coordinator warns). Standalone, package standalone generates a key pair
// at each start and hands it to the coordinator and its in-process
// workers, so that other users of the machine cannot call them.
//
// Admission: a worker whose heartbeat appears is not routed to, not
// counted for Ready, and its model not listed, until the coordinator has
// called its gRPC health service over that connection (admit.go;
// control.RequireAdmission). With TLS the handshake proved its identity;
// without, the worker is admitted unverified (logged so): anyone holding
// its role's NATS credential can register one and get requests routed to
// it, but no credential usable elsewhere. There, an elastic worker that
// changes role at the same address stays admitted (control.AdmitRoleMoves):
// it is routed to from the first heartbeat of its new role; with TLS the
// new role's certificate is checked by a new admission first. A heartbeat whose limits or
// shape contradict its role's configuration (Options.checkHeartbeat) is
// refused, logged once per reason and counted in
// pdserve_coordinator_heartbeats_refused_total{reason}: its block size
// (block_tokens) must be the coordinator's --block-tokens, which prefix
// hashes and the KV room estimate use, and a fixed --codec must be among
// the codecs its KV takes (codecs). Routing uses each worker's own context
// length (router plugin contextlen), and Models the longest an admitted
// worker takes, so one worker's heartbeat cannot lower the limits of
// the others. A decode worker that fails Reserve, or fails or ends its
// Generate before the client got a token, whatever the status, and a
// prefill worker that fails before the first token, are left for another
// worker, at most 3 in turn.
//
// # Authentication
//
// Options.Auth (--api-keys, --metrics-token-file, or the policy's
// auth.api_keys_file and auth.metrics_token_file; auth.go) loads a key
// file and a /metrics token (package apikey) at start: an invalid file,
// such as one holding a plaintext key, or a prompt_budgets.api_keys entry
// that names no key of the file, is an error of Complete (exit 2), naming
// the line and never the key. The frontend then authenticates every /v1/
// request and applies the keys' rate limits (see package frontend). The
// files are reloaded without a restart: every --auth-reload-interval
// (default 5s) when they changed, and on SIGHUP, which coordinatorrun.Main
// catches only when a file is configured; a reload that fails keeps the
// old keys and is logged. Without a key file the API is open, and the start logs a
// warning saying so. `coordinator hash-key` (coordinatorrun.HashKey)
// prints the line of a key read on stdin.
//
// # Extensions
//
// Options.Extensions run beside the request path (Extension): Start
// attaches each (Host: NATS publish, membership, the /metrics registry,
// the logger), every request the backend completes is passed to
// ObserveTrace (its budget trace; failed and cancelled requests are not),
// and Run runs until Shutdown. An Extension that is also a RequestWatcher
// hears of every request as it starts and as it ends, however it ends,
// and may add warnings to its trace. One that is a RefusalObserver hears
// of every request the pools refused for want of room (429), or another
// region served instead: demand they did not serve, which the planner
// counts; once per request, not per retry of its client (refusalSet,
// X-Stainless-Retry-Count). The online planner (--planner and
// --planner-*) is one extension, package plannerhost; coordinatorrun adds
// it. The sim engines' overrun warning of standalone mode is another.
//
// # Clocks
//
// Worker timestamps in the budget (prefill start/end, KV first byte/done,
// decode joined) come from the workers' clocks; on one host they match the
// coordinator's, across hosts they are as good as clock synchronisation.
//
// # Lifecycle
//
// Start wires everything and returns once the HTTP listener is open;
// Shutdown marks the coordinator not ready, drains HTTP requests (bounded
// by its context), calls Options.BeforeNATSDrain (package standalone stops
// its workers there), unsubscribes from NATS,
// drains the connection, stops an embedded NATS server and closes gRPC
// connections. Run does Start, waits for ctx, and Shutdown.
package coordinator
