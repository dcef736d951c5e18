// Package grpcauth decides who may call a pdserve worker's gRPC methods:
// the coordinator, and on the KV-transfer service the prefill workers.
// Both worker binaries install its server interceptors (Auth.ServerOptions);
// the coordinator and the prefill workers' KV dialers attach its
// per-RPC credentials (Auth.DialOptions).
//
// # Roles and methods
//
// A caller proves a Role with a token, with its certificate, or with both
// when both are configured (then both must grant the role):
//
//	method                                     role required
//	/pdserve.v1.DecodeService/*  (Reserve, Generate, Cancel)    coordinator
//	/pdserve.v1.PrefillService/* (Prefill, Resend, Release)     coordinator
//	/pdserve.v1.KVTransferService/Push, Pull, PullSequence      prefill
//	/grpc.health.v1.Health/*                                    anyone (probes)
//	any other method                                            nobody
//
// So a prefill worker's token or certificate cannot call Generate or
// Reserve, and the coordinator's cannot push KV.
//
// # Signed per-call credentials (--grpc-signing-key, --grpc-verify-key)
//
// The coordinator holds an Ed25519 private key (Options.SigningKeyFile)
// and signs, for every call, a credential bound to the worker it calls
// (Claims.Audience: the heartbeat's id), the method, and an expiry
// CallLifetime ahead (Auth.DialOptionsFor), sent as "pdserve-credential"
// metadata. Workers hold only the public key (Options.VerifyKeyFile) and
// accept a credential once (a nonce), for their own id (Options.Self),
// for that method, before it expires (ClockSkew allowed). A prefill
// worker holds no key: the coordinator hands it, in each Prefill and
// Resend request, a credential for one KV push to the chosen decode
// worker (Auth.PushCredential, PushLifetime), which it presents on that
// push (CredentialContext). A credential signed for the coordinator's own
// calls grants the coordinator role, a push credential the prefill role.
// So whatever a peer that is not the worker captures is worth nothing
// beyond the one call it was signed for, which already happened.
// Without a valid credential: UNAUTHENTICATED (a worker that also has a
// token, during a migration, then checks the token).
//
// # Worker identities (--tls-worker-identity)
//
// A heartbeat is a claim; with TLS a certificate is proof. The
// coordinator's connection to each worker, and a prefill worker's to each
// decode worker, verifies in its handshake that the server's certificate
// names the role and id the heartbeat claims (Auth.WorkerTLS,
// WorkerIdentity): a URI or DNS SAN equal to one of the templates with
// {role} and {id} replaced (default DefaultWorkerIdentities:
// spiffe://pdserve/{role} for any worker of the role, or
// spiffe://pdserve/{role}/{id} for one). So no request and no credential
// is sent to a peer before its identity is verified. An elastic worker,
// whose role changes at run time, has an identity that role-bound
// templates name for both worker roles ("decode=ID", "prefill=ID"; the
// chart's elastic identity), and that workers allow to move KV
// (--tls-allow-prefill), never to call as the coordinator.
//
// # Tokens (--grpc-token-file, --grpc-prefill-token-file)
//
// The coordinator's token (TokenFile) is sent by the coordinator with
// every call, as "authorization: Bearer <token>" metadata, and grants the
// coordinator role. The prefill token (PrefillTokenFile) is sent by prefill
// workers on KV pushes and grants the prefill role; a decode worker whose
// file holds the token itself (not its digest) sends it on its KV pulls
// (a migrated sequence, a peer's prefix). Without it the coordinator's
// token is the one shared token of both roles (a decode worker then
// sends none). A worker
// with a token configured refuses a call without one, or with one that is
// neither, with UNAUTHENTICATED, and a token of the wrong role with
// PERMISSION_DENIED. Tokens are compared as SHA-256 digests in constant
// time (crypto/subtle). A file holds the token (surrounding white space is
// dropped; at least MinTokenBytes bytes), or "sha256:<64 hex digits>",
// the digest of a token, which lets a component check the token without
// holding it (a component that sends a token needs the token itself). The
// files are read once, at start. A static token is the same on every
// call: over plaintext it goes to whatever address a heartbeat names, and
// is visible to whoever can read the traffic. Use it over TLS only, where
// the worker's identity is verified first; prefer signed credentials.
//
// # Certificates (--tls-allow-coordinator, --tls-allow-prefill)
//
// With mutual TLS (the worker requires client certificates its CA signed,
// see grpcnet.TLSOptions) each role may have a list of allowed
// identities: a DNS name or a URI (a SPIFFE ID such as
// spiffe://cluster.local/ns/pdserve/sa/coordinator) that must be among the
// subject alternative names of the caller's verified certificate. A
// certificate naming none of the role's identities gets PERMISSION_DENIED;
// a call without a verified certificate UNAUTHENTICATED (a worker that
// requires client certificates refuses such a connection in the TLS
// handshake already, UNAVAILABLE on the client). An empty list (the
// default) lets every certificate the CA signed act in that role, which
// is what a single certificate shared by all components needs.
//
// # Refusals and callers
//
// Every refusal is logged at warn level with the method, the peer's
// address and what was presented: "no token", "a wrong token", "a token
// of role prefill", or the certificate's names; never a token or a
// digest. (The production logger samples repeated messages.)
//
// Caller(ctx) names who made a call for per-caller limits: the identity
// the interceptor established (the certificate's allowed name, else its
// first name; "signed:<subject>" for a signed credential, "token:<role>"
// for a token), else the peer's IP address.
//
// Nothing configured (no key, no token, no allowed identity): every call is let
// through, as before this package existed; the workers then warn at start
// that their gRPC is open. Auth is safe for concurrent use.
package grpcauth
