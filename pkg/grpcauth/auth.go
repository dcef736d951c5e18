package grpcauth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"strings"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
)

// Role is what a caller may do on a worker; roles combine with | (one
// shared token grants both).
type Role uint8

// Roles.
const (
	// RoleCoordinator calls DecodeService and PrefillService.
	RoleCoordinator Role = 1 << iota
	// RolePrefill pushes KV (KVTransferService).
	RolePrefill
)

// String returns "coordinator", "prefill", "coordinator+prefill" or
// "none".
func (r Role) String() string {
	var names []string
	if r&RoleCoordinator != 0 {
		names = append(names, "coordinator")
	}
	if r&RolePrefill != 0 {
		names = append(names, "prefill")
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, "+")
}

// servicePolicy is the role each service's methods require (see the
// package doc's table); openServices need none.
var (
	servicePolicy = map[string]Role{
		pdservev1.DecodeService_ServiceDesc.ServiceName:     RoleCoordinator,
		pdservev1.PrefillService_ServiceDesc.ServiceName:    RoleCoordinator,
		pdservev1.KVTransferService_ServiceDesc.ServiceName: RolePrefill,
	}
	openServices = map[string]bool{
		healthpb.Health_ServiceDesc.ServiceName: true,
	}
)

// Required returns the role that fullMethod ("/package.Service/Method")
// requires, or open true for a method anyone may call. A method of no
// known service requires Role 0, which no caller has.
func Required(fullMethod string) (r Role, open bool) {
	svc, _, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if openServices[svc] {
		return 0, true
	}
	return servicePolicy[svc], false
}

// Auth is loaded Options: the server interceptors that enforce them and
// the client credentials that satisfy them. Safe for concurrent use.
type Auth struct {
	coord, prefill *secret // nil without tokens; the same when shared
	send           string  // the token this component sends, or ""
	allow          map[Role][]string
	signer         *Signer   // the coordinator's, or nil
	verifier       *Verifier // a worker's, or nil
	workerIDs      []string  // identity templates of workers' certificates
	log            *zap.Logger
}

// Load validates o (see Validate) and returns the Auth of a component
// that sends the token of role present. Refusals are logged on log (nil:
// not logged). Errors: as Validate.
func (o Options) Load(present Role, log *zap.Logger) (*Auth, error) {
	a, err := o.load(present)
	if err != nil {
		return nil, err
	}
	a.log = log
	if a.log == nil {
		a.log = zap.NewNop()
	}
	return a, nil
}

// Tokens reports whether calls need a token.
func (a *Auth) Tokens() bool { return a != nil && a.coord != nil }

// Identities reports whether some role has allowed certificate identities.
func (a *Auth) Identities() bool { return a != nil && len(a.allow) > 0 }

// Signs reports whether this component signs per-call credentials (the
// coordinator with a signing key).
func (a *Auth) Signs() bool { return a != nil && a.signer != nil }

// Verifies reports whether calls may present signed credentials (a
// worker with the verify key).
func (a *Auth) Verifies() bool { return a != nil && a.verifier != nil }

// DialOptionsFor returns what the coordinator needs to call the worker
// aud (its heartbeat id): per-RPC credentials that sign, for each call, a
// credential bound to aud, the method and CallLifetime; without a signing
// key, the static token (DialOptions), which the caller must send only
// over a connection whose peer identity it verified (WorkerTLS).
func (a *Auth) DialOptionsFor(aud string) []grpc.DialOption {
	if a == nil {
		return nil
	}
	if a.signer != nil {
		return []grpc.DialOption{grpc.WithPerRPCCredentials(signedCreds{s: a.signer, aud: aud})}
	}
	return a.DialOptions()
}

// PushCredential returns a credential for one KV push to the decode
// worker decodeID by the prefill worker prefillID, valid for
// PushLifetime: the coordinator sends it in the Prefill or Resend request,
// so that prefill workers hold no key of their own. "" without a signing
// key.
func (a *Auth) PushCredential(decodeID, prefillID string) string {
	if a == nil || a.signer == nil {
		return ""
	}
	return a.signer.Sign(decodeID, PushMethod, prefillID, PushLifetime)
}

// PullCredential returns a credential for one pull of a cached prefix
// from the worker holderID, in its start holderEpoch (its heartbeat's
// boot_epoch), by the worker pullerID, of exactly the block hashes chain,
// valid for PushLifetime: the coordinator sends it in the Prefill
// request's peer, as PushCredential for a push. It grants the prefill role
// on Pull only, for that chain only (CheckPull), and not after the
// holder restarted. "" without a signing key.
func (a *Auth) PullCredential(holderID, holderEpoch, pullerID string, chain []uint64) string {
	if a == nil || a.signer == nil {
		return ""
	}
	return a.signer.SignClaims(Claims{Audience: holderID, Epoch: holderEpoch, Method: PullMethod, Subject: pullerID, Chain: ChainDigest(chain)}, PushLifetime)
}

// CheckPull returns nil when the Pull call of ctx may read the block
// hashes it asks for: its signed credential names exactly that chain
// (ChainDigest). A call admitted without a signed credential (a token,
// a certificate, or an open worker) is not bound to a chain: nil.
// Errors: ErrWrongChain, wrapped.
func CheckPull(ctx context.Context, hashes []uint64) error {
	c, ok := ctx.Value(claimsKey{}).(Claims)
	if !ok {
		return nil
	}
	if c.Chain == "" || c.Chain != ChainDigest(hashes) {
		return fmt.Errorf("%w (%d block hashes asked)", ErrWrongChain, len(hashes))
	}
	return nil
}

// MigrateCredential returns a credential for one pull of the KV of the
// migrated request requestID from the decode worker holderID, in its
// start holderEpoch, by the worker pullerID, valid for PushLifetime: the
// coordinator sends it in GenerateRequest.migrate_from. It grants
// PullSequence only, for that request only (CheckPullSequence), and not
// after the holder restarted. "" without a signing key.
func (a *Auth) MigrateCredential(holderID, holderEpoch, pullerID, requestID string) string {
	if a == nil || a.signer == nil {
		return ""
	}
	return a.signer.SignClaims(Claims{Audience: holderID, Epoch: holderEpoch, Method: PullSequenceMethod, Subject: pullerID, Chain: SequenceDigest(requestID)}, PushLifetime)
}

// CheckPullSequence returns nil when the PullSequence call of ctx may
// read requestID's KV: its signed credential names that request
// (SequenceDigest). A call admitted without a signed credential is not
// bound to a request: nil. Errors: ErrWrongChain, wrapped.
func CheckPullSequence(ctx context.Context, requestID string) error {
	c, ok := ctx.Value(claimsKey{}).(Claims)
	if !ok {
		return nil
	}
	if c.Chain == "" || c.Chain != SequenceDigest(requestID) {
		return fmt.Errorf("%w (sequence %q asked)", ErrWrongChain, requestID)
	}
	return nil
}

// claimsKey is the context key of a call's verified signed credential.
type claimsKey struct{}

// DecodePullsAuthorized reports whether a decode worker told to pull a
// prefix for its local prefill can prove the prefill role that Pull
// requires: with a signing key (PullCredential grants it), or where the
// coordinator's calls carry no token (workers that check no token; a
// certificate allowlist it cannot see may still refuse). A decode worker
// holds no prefill token, so under tokens without a signing key every
// such pull would be refused: the coordinator then names no peer.
func (a *Auth) DecodePullsAuthorized() bool {
	return a == nil || a.signer != nil || (a.send == "" && a.coord == nil && a.prefill == nil)
}

// WorkerTLS returns cfg made to refuse, in the handshake, a server whose
// certificate does not name the worker role and id (see VerifyWorker and
// the identity templates of Options.WorkerIdentities). Nil for a nil cfg.
func (a *Auth) WorkerTLS(cfg *tls.Config, role, id string) *tls.Config {
	var ids []string
	if a != nil {
		ids = a.workerIDs
	}
	return VerifyWorker(cfg, ids, role, id)
}

// WorkerIdentities returns the identity templates workers' certificates
// must match (empty: any certificate). The caller must not modify it.
func (a *Auth) WorkerIdentities() []string {
	if a == nil {
		return nil
	}
	return a.workerIDs
}

// CredentialContext returns ctx carrying cred (a PushCredential) as
// outgoing metadata of the calls made with it; ctx itself when cred is
// empty.
func CredentialContext(ctx context.Context, cred string) context.Context {
	if cred == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, credHeader, cred)
}

// ServerOptions returns the unary and stream interceptors that enforce the
// policy, to pass to grpc.NewServer. A nil a enforces nothing (and returns
// none).
func (a *Auth) ServerOptions() []grpc.ServerOption {
	if a == nil {
		return nil
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(a.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(a.StreamServerInterceptor()),
	}
}

// DialOptions returns what a client needs to call workers: per-RPC
// credentials carrying this component's token, or nothing without one
// (nil a too).
func (a *Auth) DialOptions() []grpc.DialOption {
	if a == nil || a.send == "" {
		return nil
	}
	return []grpc.DialOption{grpc.WithPerRPCCredentials(bearer("Bearer " + a.send))}
}

// UnaryServerInterceptor enforces the policy on unary calls.
func (a *Auth) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := a.authorize(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor enforces the policy on streaming calls.
func (a *Auth) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := a.authorize(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return handler(srv, &stream{ServerStream: ss, ctx: ctx})
	}
}

// stream replaces a ServerStream's context with one carrying the caller.
type stream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *stream) Context() context.Context { return s.ctx }

// authHeader is the metadata key of the token ("Bearer <token>").
const authHeader = "authorization"

// authorize checks the call against the policy and returns ctx carrying
// the caller's identity, or the refusal (logged).
func (a *Auth) authorize(ctx context.Context, method string) (context.Context, error) {
	need, open := Required(method)
	if open || (a.coord == nil && len(a.allow) == 0 && a.verifier == nil) {
		if id := certIdentity(verifiedLeaf(ctx), nil); id != "" {
			ctx = context.WithValue(ctx, callerKey{}, id)
		}
		return ctx, nil
	}
	var id string
	signed := false
	if a.verifier != nil {
		md, _ := metadata.FromIncomingContext(ctx)
		switch vals := md.Get(credHeader); {
		case len(vals) > 1:
			return ctx, a.refuse(ctx, method, codes.Unauthenticated, "several signed credentials", need)
		case len(vals) == 1:
			c, err := a.verifier.Verify(vals[0], method)
			if err != nil {
				return ctx, a.refuse(ctx, method, codes.Unauthenticated, "a signed credential that is not valid here: "+err.Error(), need)
			}
			// The coordinator signs its own calls as SubjectCoordinator and
			// KV pushes for the prefill worker it chose.
			role := RolePrefill
			if c.Subject == SubjectCoordinator {
				role = RoleCoordinator
			}
			if role&need == 0 {
				return ctx, a.refuse(ctx, method, codes.PermissionDenied, "a signed credential of role "+role.String(), need)
			}
			id, signed = "signed:"+c.Subject, true
			ctx = context.WithValue(ctx, claimsKey{}, c)
		case a.coord == nil:
			return ctx, a.refuse(ctx, method, codes.Unauthenticated, "no signed credential", need)
		}
	}
	if a.coord != nil && !signed {
		roles, presented := a.tokenRoles(ctx)
		switch {
		case roles == 0:
			return ctx, a.refuse(ctx, method, codes.Unauthenticated, presented, need)
		case roles&need == 0:
			return ctx, a.refuse(ctx, method, codes.PermissionDenied, presented, need)
		}
		id = "token:" + need.String()
	}
	leaf := verifiedLeaf(ctx)
	if allowed := a.allow[need]; len(allowed) > 0 || need == 0 && len(a.allow) > 0 {
		if leaf == nil {
			return ctx, a.refuse(ctx, method, codes.Unauthenticated, "no verified client certificate", need)
		}
		match := certIdentity(leaf, allowed)
		if match == "" || need == 0 {
			return ctx, a.refuse(ctx, method, codes.PermissionDenied, "a certificate for "+certNames(leaf), need)
		}
		id = match
	} else if cid := certIdentity(leaf, nil); cid != "" {
		id = cid
	}
	return context.WithValue(ctx, callerKey{}, id), nil
}

// tokenRoles returns the roles the call's token grants (0: none, the call
// is unauthenticated) and what was presented, in words fit for a log: "no
// token", "a wrong token" or "a token of role R". Both digests are compared whatever matches, in
// constant time.
func (a *Auth) tokenRoles(ctx context.Context) (Role, string) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(authHeader)
	if len(vals) == 0 {
		return 0, "no token"
	}
	tok, ok := strings.CutPrefix(vals[0], "Bearer ")
	if !ok || len(vals) > 1 || len(tok) > maxTokenBytes {
		return 0, "a wrong token"
	}
	d := sha256.Sum256([]byte(tok))
	var r Role
	if subtle.ConstantTimeCompare(d[:], a.coord.digest[:]) == 1 {
		r |= RoleCoordinator
	}
	if subtle.ConstantTimeCompare(d[:], a.prefill.digest[:]) == 1 {
		r |= RolePrefill
	}
	if r == 0 {
		return 0, "a wrong token"
	}
	return r, "a token of role " + r.String()
}

// refuse logs a refusal (never a secret) and returns its status.
func (a *Auth) refuse(ctx context.Context, method string, code codes.Code, presented string, need Role) error {
	addr := "unknown"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	a.log.Warn("grpc call refused", zap.String("method", method), zap.String("peer", addr),
		zap.String("presented", presented), zap.Stringer("required_role", need), zap.Stringer("code", code))
	if need == 0 {
		return status.Errorf(code, "grpcauth: %s is not served to other components", method)
	}
	return status.Errorf(code, "grpcauth: %s needs the %s role; the call presented %s", method, need, presented)
}

// verifiedLeaf returns the client certificate the TLS handshake verified,
// or nil (plaintext, or no client certificate).
func verifiedLeaf(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return ti.State.VerifiedChains[0][0]
}

// certIdentity returns the first of allowed that leaf names (DNS names
// case-insensitively, URIs exactly), or, with allowed empty, leaf's first
// URI, else its first DNS name, else its common name. "" when none (or
// leaf is nil).
func certIdentity(leaf *x509.Certificate, allowed []string) string {
	if leaf == nil {
		return ""
	}
	if len(allowed) == 0 {
		switch {
		case len(leaf.URIs) > 0:
			return leaf.URIs[0].String()
		case len(leaf.DNSNames) > 0:
			return leaf.DNSNames[0]
		}
		return leaf.Subject.CommonName
	}
	for _, id := range allowed {
		for _, u := range leaf.URIs {
			if u.String() == id {
				return id
			}
		}
		for _, n := range leaf.DNSNames {
			if strings.EqualFold(n, id) {
				return id
			}
		}
	}
	return ""
}

// certNames lists a certificate's names for a log line.
func certNames(leaf *x509.Certificate) string {
	var names []string
	for _, u := range leaf.URIs {
		names = append(names, u.String())
	}
	names = append(names, leaf.DNSNames...)
	if len(names) == 0 {
		return "no name (CN " + leaf.Subject.CommonName + ")"
	}
	return strings.Join(names, ", ")
}

type callerKey struct{}

// Caller returns who made the gRPC call of ctx, for per-caller limits: the
// identity the server interceptor established (an allowed certificate
// name, a certificate's first name, or "token:<role>"), else "ip:" and
// the peer's IP address, else "" (no gRPC peer: an in-process call).
func Caller(ctx context.Context) string {
	if id, ok := ctx.Value(callerKey{}).(string); ok && id != "" {
		return id
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		host, _, err := net.SplitHostPort(p.Addr.String())
		if err != nil {
			host = p.Addr.String()
		}
		return "ip:" + host
	}
	return ""
}

// bearer is per-RPC credentials carrying one authorization value. It does
// not require transport security: without TLS a token is what protects a
// worker.
type bearer string

var _ credentials.PerRPCCredentials = bearer("")

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{authHeader: string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }
