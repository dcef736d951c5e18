package adversarial

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/frontend"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// holderBT is the block size of the KV holder's prefix cache.
const holderBT = 16

// kvHolder is a decode worker (workerrun, the binaries' wiring) with a
// prefix cache, that checks the coordinator's signed credentials when
// signer is set; the test plays the coordinator and a thief.
type kvHolder struct {
	w      *workerrun.Worker
	cc     *grpc.ClientConn
	signer *grpcauth.Signer // nil: an open worker
	key    kv.HashKey
}

// startHolder starts a holder with id "holder" on addr ("": a free
// port), keyed with key, checking credentials of pub (nil: none).
func startHolder(t *testing.T, addr string, key kv.HashKey, pub ed25519.PublicKey, priv ed25519.PrivateKey) *kvHolder {
	t.Helper()
	eng, err := ref.New(ref.Options{Preset: "tiny", Seed: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	o := workerrun.NewDecodeOptions()
	o.ID, o.EngineOverride, o.Registerer = "holder", eng, prometheus.NewRegistry()
	o.GRPCAddr, o.MetricsAddr, o.NATSURL = "127.0.0.1:0", "", ""
	if addr != "" {
		o.GRPCAddr = addr
	}
	o.HashKey = key
	o.Decode.PrefixCache.HostBytes = 0
	o.GRPCAuth.VerifyKey = pub
	w, err := workerrun.Start(context.Background(), o, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(w.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	h := &kvHolder{w: w, cc: cc, key: key}
	if priv != nil {
		h.signer = grpcauth.NewSigner(priv, nil)
	}
	t.Cleanup(func() { h.stop(t) })
	return h
}

func (h *kvHolder) stop(t *testing.T) {
	if h.w == nil {
		return
	}
	_ = h.cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.w.Stop(ctx); err != nil {
		t.Errorf("stop the holder: %v", err)
	}
	h.w = nil
}

// as returns ctx carrying cred as the signed credential ("" : none).
func as(ctx context.Context, cred string) context.Context {
	if cred == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "pdserve-credential", cred)
}

// coord returns ctx with the coordinator's credential for method.
func (h *kvHolder) coord(ctx context.Context, method string) context.Context {
	if h.signer == nil {
		return ctx
	}
	return as(ctx, h.signer.Sign("holder", method, grpcauth.SubjectCoordinator, grpcauth.CallLifetime))
}

// hold has the holder compute prompt p (a local prefill of one token):
// its prefix cache then keeps p's blocks.
func (h *kvHolder) hold(t *testing.T, id string, p []int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dc := pdservev1.NewDecodeServiceClient(h.cc)
	if _, err := dc.Reserve(h.coord(ctx, "/pdserve.v1.DecodeService/Reserve"), &pdservev1.ReserveRequest{RequestId: id, Tokens: int32(len(p) + 1), Sequences: 1}); err != nil {
		t.Fatal(err)
	}
	st, err := dc.Generate(h.coord(ctx, "/pdserve.v1.DecodeService/Generate"), &pdservev1.GenerateRequest{RequestId: id, PromptTokens: p, MaxTokens: 1, LocalPrefill: true, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := st.Recv(); errors.Is(err, io.EOF) {
			return
		} else if err != nil {
			t.Fatalf("generate %s: %v", id, err)
		}
	}
}

// pull asks the holder for the prefix of hashes with cred ("": none) and
// returns the tokens it served, or the call's error.
func (h *kvHolder) pull(hashes []kv.Hash, cred string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hs := make([]uint64, len(hashes))
	for i, x := range hashes {
		hs[i] = uint64(x)
	}
	st, err := pdservev1.NewKVTransferServiceClient(h.cc).Pull(as(ctx, cred), &pdservev1.PullRequest{RequestId: "thief", BlockHashes: hs, BlockTokens: holderBT, Codec: "none"})
	if err != nil {
		return 0, err
	}
	first, err := st.Recv()
	if err != nil {
		return 0, err
	}
	for {
		if _, err := st.Recv(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return 0, err
		}
	}
	return int(first.GetHeader().GetTokens()), nil
}

// pullCred is the coordinator's credential for one pull of chain from
// the holder's present start by "prefill-1".
func (h *kvHolder) pullCred(chain []kv.Hash) string {
	hs := make([]uint64, len(chain))
	for i, x := range chain {
		hs[i] = uint64(x)
	}
	return h.signer.SignClaims(grpcauth.Claims{
		Audience: "holder", Epoch: h.w.BootEpoch(), Method: grpcauth.PullMethod, Subject: "prefill-1", Chain: grpcauth.ChainDigest(hs),
	}, grpcauth.PushLifetime)
}

// prompt returns n tokens of the tiny model's vocabulary from seed.
func prompt(n int, seed int32) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = 1 + (seed*37+int32(i)*11)%200
	}
	return p
}

// held waits until a pull of p's 6 blocks with a valid credential (none
// on an open holder) gets them all: the holder's cache keeps p.
func (h *kvHolder) held(t *testing.T, hashes []kv.Hash) {
	t.Helper()
	poll.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		cred := ""
		if h.signer != nil {
			cred = h.pullCred(hashes)
		}
		n, err := h.pull(hashes, cred)
		if err != nil {
			return err
		}
		if n != len(hashes)*holderBT {
			return errors.New("not cached yet")
		}
		return nil
	})
}

func newKeyPair(t *testing.T) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

// TestPullCredentialReadsOnlyItsChain: a pull credential the coordinator
// signed for prompt Q does not read tenant A's prompt S from the same
// holder (PERMISSION_DENIED), while one for S does. Issue 38 finding 3:
// before, the credential was bound to the holder and the method only,
// and one issued for Q pulled S whole (96 tokens here).
func TestPullCredentialReadsOnlyItsChain(t *testing.T) {
	pub, priv := newKeyPair(t)
	key := kv.GenerateHashKey()
	h := startHolder(t, "", key, pub, priv)
	s, q := prompt(100, 1), prompt(100, 2) // 6 full blocks each
	hs, hq := key.Blocks(0, s, holderBT), key.Blocks(0, q, holderBT)
	h.hold(t, "s", s)
	h.held(t, hs)
	n, err := h.pull(hs, h.pullCred(hq))
	if status.Code(err) != codes.PermissionDenied || n != 0 {
		t.Errorf("Q's credential pulling S: %d tokens, %v; want PERMISSION_DENIED", n, err)
	}
	// A prefix of S is not S's chain either.
	n, err = h.pull(hs[:3], h.pullCred(hs))
	if status.Code(err) != codes.PermissionDenied || n != 0 {
		t.Errorf("S's credential pulling 3 of its blocks: %d tokens, %v; want PERMISSION_DENIED", n, err)
	}
}

// TestOneHashSixTimes: a pull of one known block's hash sent six times
// gets at most that block, not the 6-block entry holding it. Issue 38
// finding 3: cache matching counted the presence of each hash, and
// returned 96 tokens.
func TestOneHashSixTimes(t *testing.T) {
	key := kv.GenerateHashKey()
	h := startHolder(t, "", key, nil, nil) // an open worker: no credential bounds the pull
	s := prompt(100, 3)
	hs := key.Blocks(0, s, holderBT)
	h.hold(t, "s", s)
	h.held(t, hs)
	six := []kv.Hash{hs[0], hs[0], hs[0], hs[0], hs[0], hs[0]}
	n, err := h.pull(six, "")
	if err != nil {
		t.Fatal(err)
	}
	if n > holderBT {
		t.Errorf("one block's hash six times pulled %d tokens, want at most %d", n, holderBT)
	}
}

// TestPullCredentialReplayAfterRestart: a used pull credential is refused
// by the holder after it restarts (same id, same address) within the
// credential's lifetime. Issue 38 finding 9: "single use" held per
// process only, and the replay read the prompt again.
func TestPullCredentialReplayAfterRestart(t *testing.T) {
	pub, priv := newKeyPair(t)
	key := kv.GenerateHashKey()
	h := startHolder(t, "", key, pub, priv)
	addr := h.w.ListenAddr()
	s := prompt(100, 4)
	hs := key.Blocks(0, s, holderBT)
	h.hold(t, "s", s)
	h.held(t, hs)
	cred := h.pullCred(hs)
	if n, err := h.pull(hs, cred); err != nil || n != 96 {
		t.Fatalf("first use: %d tokens, %v; want 96", n, err)
	}
	if _, err := h.pull(hs, cred); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("second use in the same start: %v, want UNAUTHENTICATED", err)
	}
	h.stop(t)
	h2 := startHolder(t, addr, key, pub, priv)
	h2.hold(t, "s", s)
	h2.held(t, hs)
	if n, err := h2.pull(hs, cred); status.Code(err) != codes.Unauthenticated || n != 0 {
		t.Errorf("replay after a restart: %d tokens, %v; want UNAUTHENTICATED", n, err)
	}
}

// TestCrossTenantPrefixOracle: key B sending key A's prompt gets
// prefix_hit_tokens 0, while A's own repeat hits; two keys that name one
// tenant share. Issue 38 finding 5: the shared cache told B, in
// prefix_hit_tokens, whether A had asked the prompt (a 2-digit secret in
// 14 requests).
func TestCrossTenantPrefixOracle(t *testing.T) {
	const keyB, keyD = "sk-tenant-b-0123456789abcdef", "sk-tenant-d-0123456789abcdef"
	d := start(t, nil, func(o *coordinator.Options) {
		o.Auth.APIKeysFile = keyFile(t, keyA+" name=a", keyB+" name=b", keyC+" name=c tenant=shared", keyD+" name=d tenant=shared")
	})
	// About 200 tokens: several blocks.
	secret := `{"prompt":"` + strings.Repeat("CONFIDENTIAL tenant A: merger closes 2027-03-14 at 41.50 per share. ", 4) + `","max_tokens":1,"temperature":0}`
	hit := func(key string) int {
		t.Helper()
		r := d.post(t, frontend.RouteCompletions, key, strings.NewReader(secret))
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		return prefixHit(t, r.body)
	}
	hit(keyA)
	poll.WaitFor(t, "tenant A's repeat to hit its own cache", func() bool { return hit(keyA) > 0 })
	if n := hit(keyB); n != 0 {
		t.Errorf("key B sending key A's prompt: prefix_hit_tokens %d, want 0", n)
	}
	hit(keyC)
	poll.WaitFor(t, "key D to hit what key C of the same tenant cached", func() bool { return hit(keyD) > 0 })
}

// prefixHit returns the pdserve object's prefix_hit_tokens of a
// completion's body.
func prefixHit(t *testing.T, body string) int {
	t.Helper()
	var r struct {
		PDServe struct {
			PrefixHitTokens *int `json:"prefix_hit_tokens"`
		} `json:"pdserve"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil || r.PDServe.PrefixHitTokens == nil {
		t.Fatalf("no pdserve.prefix_hit_tokens in %s (%v)", body, err)
	}
	return *r.PDServe.PrefixHitTokens
}
