package grpcauth

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
)

const reserveMethod = "/pdserve.v1.DecodeService/Reserve"

func newKeys(t *testing.T) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

// A credential is good for one call of its method on its worker before
// it expires, and for nothing else.
func TestVerify(t *testing.T) {
	pub, priv := newKeys(t)
	_, otherKey := newKeys(t)
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { return now }
	s := NewSigner(priv, clock)
	good := s.Sign("decode-0", reserveMethod, SubjectCoordinator, CallLifetime)
	tampered := []byte(good)
	tampered[len(credPrefix)+3] ^= 1
	tests := []struct {
		name, cred, method string
		at                 time.Duration // after now
		want               error
	}{
		{"good", good, reserveMethod, 0, nil},
		{"another worker's", s.Sign("decode--evil", reserveMethod, SubjectCoordinator, CallLifetime), reserveMethod, 0, ErrWrongAudience},
		{"another method's", s.Sign("decode-0", PushMethod, "prefill-0", PushLifetime), reserveMethod, 0, ErrWrongMethod},
		{"expired", s.Sign("decode-0", reserveMethod, SubjectCoordinator, CallLifetime), reserveMethod, CallLifetime + ClockSkew, ErrExpired},
		{"within the skew", s.Sign("decode-0", reserveMethod, SubjectCoordinator, CallLifetime), reserveMethod, CallLifetime + ClockSkew - time.Second, nil},
		{"valid for too long", s.Sign("decode-0", reserveMethod, SubjectCoordinator, time.Hour), reserveMethod, 0, ErrExpired},
		{"another key's", NewSigner(otherKey, clock).Sign("decode-0", reserveMethod, SubjectCoordinator, CallLifetime), reserveMethod, 0, ErrBadCredential},
		{"tampered", string(tampered), reserveMethod, 0, ErrBadCredential},
		{"a token", coordToken, reserveMethod, 0, ErrBadCredential},
		{"empty", "", reserveMethod, 0, ErrBadCredential},
		{"huge", credPrefix + strings.Repeat("a", 5000), reserveMethod, 0, ErrBadCredential},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := NewVerifier(pub, "decode-0", func() time.Time { return now.Add(tc.at) })
			_, err := v.Verify(tc.cred, tc.method)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Errorf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
	v := NewVerifier(pub, "decode-0", clock)
	if _, err := v.Verify(good, reserveMethod); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(good, reserveMethod); !errors.Is(err, ErrReplayed) {
		t.Errorf("the same credential again: %v, want ErrReplayed", err)
	}
	if _, err := NewVerifier(pub, "", clock).Verify(s.Sign("", reserveMethod, SubjectCoordinator, CallLifetime), reserveMethod); !errors.Is(err, ErrWrongAudience) {
		t.Errorf("a verifier without an id accepted a credential: %v", err)
	}
}

// The key files: keygen's output loads, a private key is refused as a
// worker's verify key, a signing key is refused on a worker.
func TestKeyFiles(t *testing.T) {
	dir := t.TempDir()
	priv, pub, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	privFile, pubFile := filepath.Join(dir, "signing.pem"), filepath.Join(dir, "verify.pem")
	for f, b := range map[string][]byte{privFile: priv, pubFile: pub} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := (Options{SigningKeyFile: privFile}).Validate(RoleCoordinator); err != nil {
		t.Errorf("coordinator with the signing key: %v", err)
	}
	if err := (Options{VerifyKeyFile: pubFile, Self: "decode-0"}).Validate(0); err != nil {
		t.Errorf("worker with the verify key: %v", err)
	}
	for name, tc := range map[string]struct {
		o       Options
		present Role
		want    string
	}{
		"private key as verify key": {Options{VerifyKeyFile: privFile}, 0, "holds a private key"},
		"signing key on a worker":   {Options{SigningKeyFile: privFile}, RolePrefill, "the coordinator's"},
		"public key as signing key": {Options{SigningKeyFile: pubFile}, RoleCoordinator, `want an Ed25519 "PRIVATE KEY"`},
		"missing":                   {Options{VerifyKeyFile: filepath.Join(dir, "nope")}, 0, "grpc-verify-key"},
		"bad template":              {Options{WorkerIdentities: []string{"spiffe://pdserve/decode"}}, RoleCoordinator, "needs {role}"},
	} {
		t.Run(name, func(t *testing.T) {
			if err := tc.o.Validate(tc.present); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %v, want an error about %q", err, tc.want)
			}
		})
	}
	k, err := (Options{SigningKeyFile: privFile}).PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	v, err := readVerifyKey(pubFile)
	if err != nil || !v.Equal(k) {
		t.Errorf("PublicKey of the signing key differs from the verify key file (%v)", err)
	}
}

// End to end through the interceptor: the coordinator's per-call
// credentials for the worker's id pass; the same credential captured by
// another peer is worth nothing against the worker (signed for another
// id, or already used); a push credential pushes once and calls nothing
// else.
func TestSignedCalls(t *testing.T) {
	pub, priv := newKeys(t)
	worker, err := Options{VerifyKey: pub, Self: "decode-0"}.Load(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr, f := serve(t, worker)
	coord, err := Options{SigningKey: priv}.Load(RoleCoordinator, nil)
	if err != nil {
		t.Fatal(err)
	}
	reserve, push, _ := calls(t, dial(t, addr, coord.DialOptionsFor("decode-0")...))
	if reserve != codes.OK || push != codes.PermissionDenied {
		t.Errorf("coordinator's credentials for decode-0: Reserve %v, Push %v; want OK and a refusal (signed for Reserve only)", reserve, push)
	}
	if got := f.lastCaller(); got != "signed:coordinator" {
		t.Errorf("Caller = %q, want signed:coordinator", got)
	}
	reserve, _, _ = calls(t, dial(t, addr, coord.DialOptionsFor("decode--evil")...))
	if reserve != codes.Unauthenticated {
		t.Errorf("credentials signed for decode--evil: Reserve %v, want UNAUTHENTICATED", reserve)
	}
	reserve, _, _ = calls(t, dial(t, addr))
	if reserve != codes.Unauthenticated {
		t.Errorf("no credential: Reserve %v, want UNAUTHENTICATED", reserve)
	}

	// A captured credential: replayed, it is refused.
	cred := coord.signer.Sign("decode-0", reserveMethod, SubjectCoordinator, CallLifetime)
	cc := dial(t, addr)
	reserveWith := func() codes.Code {
		ctx := metadata.AppendToOutgoingContext(ctxT(t), credHeader, cred)
		_, err := pdservev1.NewDecodeServiceClient(cc).Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "r", Tokens: 1})
		return status.Code(err)
	}
	if got := reserveWith(); got != codes.OK {
		t.Fatalf("first use: %v", got)
	}
	if got := reserveWith(); got != codes.Unauthenticated {
		t.Errorf("replayed credential: %v, want UNAUTHENTICATED", got)
	}

	pushCred := coord.PushCredential("decode-0", "prefill-3")
	pushWith := func() codes.Code {
		st, err := pdservev1.NewKVTransferServiceClient(cc).Push(CredentialContext(ctxT(t), pushCred))
		if err == nil {
			_, err = st.CloseAndRecv()
		}
		return status.Code(err)
	}
	if got := pushWith(); got != codes.OK {
		t.Errorf("push credential: %v, want OK", got)
	}
	if got := f.lastCaller(); got != "signed:prefill-3" {
		t.Errorf("Caller = %q, want signed:prefill-3", got)
	}
	if got := pushWith(); got != codes.Unauthenticated {
		t.Errorf("push credential used twice: %v, want UNAUTHENTICATED", got)
	}
	ctx := CredentialContext(ctxT(t), coord.PushCredential("decode-0", "prefill-3"))
	if _, err := pdservev1.NewDecodeServiceClient(cc).Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "r", Tokens: 1}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("push credential on Reserve: %v, want UNAUTHENTICATED", err)
	}
}

// During a migration a worker with both the verify key and the token
// accepts either.
func TestSignedOrToken(t *testing.T) {
	pub, priv := newKeys(t)
	worker, err := Options{VerifyKey: pub, Self: "decode-0", Token: coordToken}.Load(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serve(t, worker)
	signer, _ := Options{SigningKey: priv}.Load(RoleCoordinator, nil)
	tok, _ := Options{Token: coordToken}.Load(RoleCoordinator, nil)
	for name, opts := range map[string][]grpc.DialOption{"signed": signer.DialOptionsFor("decode-0"), "token": tok.DialOptionsFor("decode-0")} {
		if reserve, _, _ := calls(t, dial(t, addr, opts...)); reserve != codes.OK {
			t.Errorf("%s: Reserve %v, want OK", name, reserve)
		}
	}
	if reserve, _, _ := calls(t, dial(t, addr, signer.DialOptionsFor("decode-1")...)); reserve != codes.Unauthenticated {
		t.Errorf("a bad signed credential does not fall back to the token: Reserve %v, want UNAUTHENTICATED", reserve)
	}
}

// TestDecodePullsAuthorized: a decode worker can prove the prefill role on
// Pull with a signed pull credential, or where no token is configured;
// under tokens without a signing key it cannot (it holds no prefill
// token), so the coordinator names no peer to it.
func TestDecodePullsAuthorized(t *testing.T) {
	priv, _, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	privFile := filepath.Join(t.TempDir(), "signing.pem")
	if err := os.WriteFile(privFile, priv, 0o600); err != nil {
		t.Fatal(err)
	}
	tokens := writeFile(t, "coord", coordToken)
	for _, tc := range []struct {
		name string
		o    Options
		want bool
	}{
		{"open", Options{}, true},
		{"signing key", Options{SigningKeyFile: privFile}, true},
		{"tokens and a signing key", Options{TokenFile: tokens, SigningKeyFile: privFile}, true},
		{"tokens alone", Options{TokenFile: tokens}, false},
	} {
		a, err := tc.o.Load(RoleCoordinator, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := a.DecodePullsAuthorized(); got != tc.want {
			t.Errorf("%s: DecodePullsAuthorized() = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestVerifyPullBinding: a pull credential is bound to the holder's start
// (a restarted holder, a new epoch, refuses it: issue 38 finding 9) and
// must name a chain; a call credential bound to an epoch is refused by
// another start too.
func TestVerifyPullBinding(t *testing.T) {
	pub, priv := newKeys(t)
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { return now }
	s := NewSigner(priv, clock)
	chain := ChainDigest([]uint64{1, 2, 3})
	pull := func(epoch, chain string) string {
		return s.SignClaims(Claims{Audience: "decode-0", Epoch: epoch, Method: PullMethod, Subject: "prefill-0", Chain: chain}, PushLifetime)
	}
	for _, tc := range []struct {
		name, cred, epoch string
		want              error
	}{
		{"this start", pull("e1", chain), "e1", nil},
		{"after a restart", pull("e1", chain), "e2", ErrWrongEpoch},
		{"no epoch", pull("", chain), "e1", ErrWrongEpoch},
		{"no chain", pull("e1", ""), "e1", ErrWrongChain},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewVerifierAt(pub, "decode-0", tc.epoch, clock).Verify(tc.cred, PullMethod)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Errorf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
	call := s.SignClaims(Claims{Audience: "decode-0", Epoch: "e1", Method: reserveMethod, Subject: SubjectCoordinator}, CallLifetime)
	if _, err := NewVerifierAt(pub, "decode-0", "e2", clock).Verify(call, reserveMethod); !errors.Is(err, ErrWrongEpoch) {
		t.Errorf("a call credential of another start: %v, want ErrWrongEpoch", err)
	}
}

// TestCheckPull: a pull with a signed credential reads exactly the chain
// it names; not a prefix of it, not another prompt's (issue 38 finding 3).
func TestCheckPull(t *testing.T) {
	chain := []uint64{11, 22, 33}
	ctx := context.WithValue(context.Background(), claimsKey{}, Claims{Method: PullMethod, Chain: ChainDigest(chain)})
	for _, tc := range []struct {
		name   string
		hashes []uint64
		ok     bool
	}{
		{"the chain", chain, true},
		{"a prefix", chain[:2], false},
		{"another prompt", []uint64{44, 55, 66}, false},
		{"longer", []uint64{11, 22, 33, 44}, false},
	} {
		if err := CheckPull(ctx, tc.hashes); (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrWrongChain)) {
			t.Errorf("%s: CheckPull = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
	if err := CheckPull(context.Background(), []uint64{1}); err != nil {
		t.Errorf("a call without a signed credential: %v", err)
	}
}
