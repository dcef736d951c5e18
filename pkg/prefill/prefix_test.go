package prefill

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// cachedOptions turns the prefix cache on with blocks of 16 tokens.
func cachedOptions(tokens, entries int) Options {
	o := smallOptions()
	o.ChunkTokens, o.MaxBatchTokens, o.MaxLivePrefills = 16, 64, 64
	o.PrefixCache = prefixcache.Options{MaxTokens: tokens, MaxEntries: entries, BlockTokens: 16}
	return o
}

// sharing returns a prompt of n tokens whose first shared tokens are
// base's, the rest its own (from seed).
func sharing(base []int32, n, shared int, seed int32) []int32 {
	p := prompt(n, seed)
	copy(p, base[:min(shared, n)])
	for i := shared; i < n; i++ {
		p[i] = (p[i] + 1 + seed) % 250 // differs from base's token i
		if i < len(base) && p[i] == base[i] {
			p[i] = (p[i] + 1) % 250
		}
	}
	return p
}

// wantHit is the cache hit a prompt gets from the prompts cached before:
// the longest shared prefix, in whole blocks of 16, leaving a token to
// compute.
func wantHit(p []int32, cached [][]int32) int {
	best := 0
	for _, c := range cached {
		n := 0
		for n < len(p) && n < len(c) && p[n] == c[n] {
			n++
		}
		best = max(best, n)
	}
	return min(best/16, (len(p)-1)/16) * 16
}

// prefillOne runs one Prefill call (its request changed by each of
// with) and checks its first token and KV against the engine alone,
// bit-exact; it returns the events and what the receiver got.
func prefillOne(t *testing.T, w *testWorker, f *fakeReceiver, addr, id string, p []int32, skip int, with ...func(*pdservev1.PrefillRequest)) (events, received) {
	t.Helper()
	first, kv := referenceKV(t, p)
	req := &pdservev1.PrefillRequest{RequestId: id, PromptTokens: p, DecodeAddr: addr, SkipTokens: int32(skip)}
	for _, f := range with {
		f(req)
	}
	stream, err := w.client.Prefill(testCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := collect(stream)
	if err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	got, _ := f.get(id)
	if ev.first.GetToken() != first || got.first != first {
		t.Errorf("%s: first token %d (receiver %d), engine alone %d", id, ev.first.GetToken(), got.first, first)
	}
	if got.h.Start != skip {
		t.Errorf("%s: stream starts at token %d, want %d", id, got.h.Start, skip)
	}
	want := kv
	if skip > 0 {
		want = make([][]byte, len(kv))
		for l := range kv {
			want[l] = tailKV(kv[l], len(p), skip)
		}
	}
	if diff := cmp.Diff(want, got.layers); diff != "" {
		t.Errorf("%s: kv received differs from the engine alone's (-engine +received):\n%s", id, diff)
	}
	var raw int64
	for _, l := range want {
		raw += int64(len(l))
	}
	if ev.done.GetBytesRaw() != raw {
		t.Errorf("%s: kv done bytes raw %d, want %d", id, ev.done.GetBytesRaw(), raw)
	}
	return ev, got
}

// TestPrefixCacheBitExact prefills prompts that share prefixes of many
// lengths with earlier ones, block-aligned or not: the first token and
// the KV sent are the engine's without a cache, bit for bit, and the
// reported hit is the cached whole blocks.
func TestPrefixCacheBitExact(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	w := newWorker(t, cachedOptions(1<<16, 64), true)
	base := prompt(70, 3)
	cached := [][]int32{}
	cases := []struct{ n, shared int }{
		{70, 70}, // the base itself, a miss
		{70, 70}, // again: every block but the partial one
		{64, 64}, // aligned, fully cached: its last block is computed
		{40, 15}, {40, 16}, {40, 17}, {50, 32}, {90, 48}, {90, 69}, {90, 70}, {33, 0},
	}
	for i, tc := range cases {
		p := base[:min(tc.n, len(base))]
		if tc.n > len(base) || tc.shared < tc.n {
			p = sharing(base, tc.n, tc.shared, int32(i+5))
		}
		id := fmt.Sprintf("r%d-%d-%d", i, tc.n, tc.shared)
		want := wantHit(p, cached)
		ev, _ := prefillOne(t, w, f, addr, id, p, 0)
		if got := int(ev.first.GetHit().GetTokens()); got != want {
			t.Errorf("%s: prefix_hit_tokens %d, want %d", id, got, want)
		}
		cached = append(cached, p)
	}
	st := w.s.Stats().PrefixCache
	if st.Lookups != uint64(len(cases)) || st.Hits == 0 || st.HitTokens == 0 || st.Pinned != 0 {
		t.Errorf("cache stats %+v", st)
	}
	if d := w.s.PrefixDigest(prefixcache.DefaultDigestHashes); len(d) == 0 {
		t.Error("empty digest after caching prompts")
	}
}

// TestPrefixCacheSkipTokens sends KV from skip_tokens on, with and
// without a local hit before or after that token.
func TestPrefixCacheSkipTokens(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	w := newWorker(t, cachedOptions(1<<16, 64), true)
	base := prompt(60, 9)
	for i, skip := range []int{16, 0, 32, 48, 5, 59} {
		ev, got := prefillOne(t, w, f, addr, fmt.Sprintf("skip-%d-%d", i, skip), base, skip)
		if i > 0 && ev.first.GetHit().GetTokens() != 48 {
			t.Errorf("skip %d: local hit %d, want 48", skip, ev.first.GetHit().GetTokens())
		}
		tb := len(got.layers[0]) / (len(base) - skip)
		if want := int64(len(got.layers) * (len(base) - skip) * tb); ev.done.GetBytesRaw() != want {
			t.Errorf("skip %d: bytes raw %d, want %d", skip, ev.done.GetBytesRaw(), want)
		}
	}
	stream, err := w.client.Prefill(testCtx(t), &pdservev1.PrefillRequest{RequestId: "bad", PromptTokens: base, DecodeAddr: addr, SkipTokens: 60})
	if err == nil {
		_, err = collect(stream)
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("skip_tokens = len(prompt): %v, want INVALID_ARGUMENT", err)
	}
}

// TestPrefixCacheConcurrentUnderPressure runs many requests at once that
// share blocks, with a cache too small for them: entries are evicted
// while others are forked from, and every result stays bit-exact (a
// freed block in use would change the KV or fail the engine). Run with
// -race.
func TestPrefixCacheConcurrentUnderPressure(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	w := newWorker(t, cachedOptions(100, 2), true)
	bases := [][]int32{prompt(48, 1), prompt(48, 2), prompt(48, 3)}
	var wg sync.WaitGroup
	for i := range 18 {
		wg.Go(func() {
			b := bases[i%len(bases)]
			p := sharing(b, 40+i, 16*(1+i%3), int32(i+20))
			prefillOne(t, w, f, addr, fmt.Sprintf("c%d", i), p, 0)
		})
	}
	wg.Wait()
	st := w.s.Stats().PrefixCache
	if st.Entries > 2 || st.Tokens > 100 || st.Pinned != 0 || st.Evictions == 0 {
		t.Errorf("cache stats %+v: want within bounds, unpinned, with evictions", st)
	}
	t.Logf("cache stats %+v", st)
}

// boundedEngine is the ref engine with a fixed KV memory, as llama.cpp's
// context: a step or fork that would hold more than tokens KV tokens or
// seqs sequences fails, and the most it held is recorded. Only the
// scheduler calls it; Stats-like reads take mu.
type boundedEngine struct {
	*ref.Engine
	tokens, seqs int

	mu               sync.Mutex
	live             map[engine.SeqID]bool
	peakTok, peakSeq int
	// gate, when not nil, holds the first Prefill until it is closed.
	gate chan struct{}
}

func newBoundedEngine(t *testing.T, tokens, seqs int) *boundedEngine {
	return &boundedEngine{Engine: newEngine(t), tokens: tokens, seqs: seqs, live: map[engine.SeqID]bool{}}
}

func (e *boundedEngine) KVCapacity() (tokens, seqs int) { return e.tokens, e.seqs }

// admit checks that the live sequences, with extra tokens more, fit.
func (e *boundedEngine) admit(extra int) error {
	n := extra
	for q := range e.live {
		l, _ := e.Engine.Len(q)
		n += l
	}
	e.peakTok, e.peakSeq = max(e.peakTok, n), max(e.peakSeq, len(e.live))
	if n > e.tokens || len(e.live) > e.seqs {
		return fmt.Errorf("bounded engine: %d tokens in %d sequences exceed %d in %d", n, len(e.live), e.tokens, e.seqs)
	}
	return nil
}

func (e *boundedEngine) Prefill(ctx context.Context, batch []engine.PrefillItem, onKV engine.KVFunc) ([]engine.Output, error) {
	if e.gate != nil {
		<-e.gate
	}
	e.mu.Lock()
	extra := 0
	for _, it := range batch {
		e.live[it.Seq] = true
		extra += len(it.Tokens)
	}
	err := e.admit(extra)
	e.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return e.Engine.Prefill(ctx, batch, onKV)
}

func (e *boundedEngine) Fork(src, dst engine.SeqID, n int) error {
	e.mu.Lock()
	e.live[dst] = true
	err := e.admit(n)
	e.mu.Unlock()
	if err != nil {
		return err
	}
	return e.Engine.Fork(src, dst, n)
}

func (e *boundedEngine) Free(seq engine.SeqID) {
	e.mu.Lock()
	delete(e.live, seq)
	e.mu.Unlock()
	e.Engine.Free(seq)
}

func (e *boundedEngine) peak() (tokens, seqs int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.peakTok, e.peakSeq
}

// TestPrefixCacheAutoYieldsEngineMemory: by default (Auto) the cache is
// sized by the engine's KV memory, and a starting request takes the
// memory and sequence slots of the least recently used entries, so
// concurrent requests on an engine that refuses to hold more than its
// memory all succeed, bit-exact, with the cache full in between. Without
// the eviction on demand the cache would fill the engine and its steps
// fail. Run with -race.
func TestPrefixCacheAutoYieldsEngineMemory(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	eng := newBoundedEngine(t, 320, 8)
	o := smallOptions()
	o.ChunkTokens, o.MaxBatchTokens, o.MaxLivePrefills = 16, 64, 64
	if o.PrefixCache.MaxTokens != prefixcache.Auto {
		t.Fatalf("default prefix-cache-tokens %d, want Auto", o.PrefixCache.MaxTokens)
	}
	w := newWorkerOn(t, eng, o, true)
	if got := w.s.o.PrefixCache; got.MaxTokens != 320 || got.MaxEntries != 7 {
		t.Fatalf("auto cache sized %d tokens, %d entries; want the engine's 320 and 8 slots less one", got.MaxTokens, got.MaxEntries)
	}
	// Fill the cache: 6 distinct prompts of 48 tokens (288 tokens).
	for i := range 6 {
		prefillOne(t, w, f, addr, fmt.Sprintf("fill%d", i), prompt(48, int32(40+i)), 0)
	}
	if st := w.s.Stats().PrefixCache; st.Tokens != 288 || st.Entries != 6 {
		t.Fatalf("after filling: cache %+v, want 288 tokens in 6 entries", st)
	}
	bases := [][]int32{prompt(48, 40), prompt(48, 41), prompt(48, 1)}
	var wg sync.WaitGroup
	for i := range 18 {
		wg.Go(func() {
			p := sharing(bases[i%len(bases)], 40+i, 16*(1+i%3), int32(i+20))
			prefillOne(t, w, f, addr, fmt.Sprintf("c%d", i), p, 0)
		})
	}
	wg.Wait()
	st := w.s.Stats().PrefixCache
	if st.Reclaims == 0 || st.Hits == 0 || st.Pinned != 0 || st.Tokens > 320 {
		t.Errorf("cache stats %+v: want reclaims for live requests, hits, no pin, within the engine", st)
	}
	if tok, seqs := eng.peak(); tok > 320 || seqs > 8 {
		t.Errorf("engine held up to %d tokens in %d sequences, over its 320 in 8", tok, seqs)
	}
}

// TestLiveRequestsWaitForEngineMemory: the engine's KV memory bounds the
// requests prefilling at once, cache or none. Eight 48-token prompts
// queued together, with a step budget that would start all of them (8
// chunks of 8), do not fit 320 tokens (384): the scheduler starts six
// (288 tokens), the others wait for them, and every request succeeds
// with the engine never over its memory. Started together, the step
// would overflow the engine and fail all eight.
func TestLiveRequestsWaitForEngineMemory(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	eng := newBoundedEngine(t, 320, 8)
	eng.gate = make(chan struct{})
	o := smallOptions()
	o.ChunkTokens, o.MaxBatchTokens, o.MaxLivePrefills = 8, 64, 64
	o.PrefixCache.MaxTokens = 0
	w := newWorkerOn(t, eng, o, true)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() { prefillOne(t, w, f, addr, fmt.Sprintf("r%d", i), prompt(48, int32(40+i)), 0) })
	}
	deadline := time.Now().Add(time.Minute)
	for w.s.Stats().QueuedRequests < 8 {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests queued, want 8", w.s.Stats().QueuedRequests)
		}
		time.Sleep(time.Millisecond)
	}
	close(eng.gate)
	wg.Wait()
	if tok, seqs := eng.peak(); tok > 320 || seqs > 8 {
		t.Errorf("engine held up to %d tokens in %d sequences, over its 320 in 8", tok, seqs)
	}
}
