package prefill

import (
	"fmt"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// cachedOptions turns the prefix cache on with blocks of 16 tokens.
func cachedOptions(tokens, entries int) Options {
	o := smallOptions()
	o.ChunkTokens, o.MaxBatchTokens, o.QueueLimit = 16, 64, 64
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

// prefillOne runs one Prefill call and checks its first token and KV
// against the engine alone, bit-exact; it returns the events and what the
// receiver got.
func prefillOne(t *testing.T, w *testWorker, f *fakeReceiver, addr, id string, p []int32, skip int) (events, received) {
	t.Helper()
	first, kv := referenceKV(t, p)
	stream, err := w.client.Prefill(testCtx(t), &pdservev1.PrefillRequest{RequestId: id, PromptTokens: p, DecodeAddr: addr, SkipTokens: int32(skip)})
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
		if got := int(ev.first.GetPrefixHitTokens()); got != want {
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
		if i > 0 && ev.first.GetPrefixHitTokens() != 48 {
			t.Errorf("skip %d: local hit %d, want 48", skip, ev.first.GetPrefixHitTokens())
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
