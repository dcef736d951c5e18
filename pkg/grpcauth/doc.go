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
//	/pdserve.v1.KVTransferService/Push                          prefill
//	/grpc.health.v1.Health/*                                    anyone (probes)
//	any other method                                            nobody
//
// So a prefill worker's token or certificate cannot call Generate or
// Reserve, and the coordinator's cannot push KV.
//
// # Tokens (--grpc-token-file, --grpc-prefill-token-file)
//
// The coordinator's token (TokenFile) is sent by the coordinator with
// every call, as "authorization: Bearer <token>" metadata, and grants the
// coordinator role. The prefill token (PrefillTokenFile) is sent by prefill
// workers on KV pushes and grants the prefill role; without it the
// coordinator's token is the one shared token of both roles. A worker
// with a token configured refuses a call without one, or with one that is
// neither, with UNAUTHENTICATED, and a token of the wrong role with
// PERMISSION_DENIED. Tokens are compared as SHA-256 digests in constant
// time (crypto/subtle). A file holds the token (surrounding white space is
// dropped; at least MinTokenBytes bytes), or "sha256:<64 hex digits>",
// the digest of a token, which lets a component check the token without
// holding it (a component that sends a token needs the token itself). The
// files are read once, at start. Over plaintext the token is visible to
// whoever can read the traffic: combine it with network policies, or TLS.
//
// # Certificates (--tls-allow-coordinator, --tls-allow-prefill)
//
// With mutual TLS (the worker requires client certificates its CA signed,
// see workerrun.TLSOptions) each role may have a list of allowed
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
// first name; "token:<role>" for a token), else the peer's IP address.
//
// Nothing configured (no token, no allowed identity): every call is let
// through, as before this package existed; the workers then warn at start
// that their gRPC is open. Auth is safe for concurrent use.
package grpcauth
