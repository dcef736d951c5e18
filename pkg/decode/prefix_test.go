package decode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// cachedOptions turns the prefix cache on (blocks of 16 tokens).
func cachedOptions(tokens, entries int) Options {
	o := smallOptions()
	o.KVBlocks = 256
	o.PrefixCache = prefixcache.Options{MaxTokens: tokens, MaxEntries: entries}
	return o
}

// sharing returns a prompt of n tokens whose first shared tokens are
// base's and the rest differ from it.
func sharing(base []int32, n, shared int, seed int32) []int32 {
	p := prompt(n, seed)
	copy(p, base[:min(shared, n)])
	for i := shared; i < n && i < len(base); i++ {
		if p[i] == base[i] {
			p[i] = (p[i] + 1) % 250
		}
	}
	return p
}

// generateLocal runs one colocated Generate call and checks its tokens
// against the engine alone, bit for bit.
func generateLocal(t *testing.T, w *testWorker, id string, p []int32, maxTokens int) {
	t.Helper()
	want := reference(t, p, maxTokens, engine.Sampling{})
	stream, err := w.client.Generate(testCtx(t), &pdservev1.GenerateRequest{RequestId: id, PromptTokens: p, MaxTokens: int32(maxTokens), LocalPrefill: true, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := collect(stream)
	if err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	if diff := cmp.Diff(want, got.tokens); diff != "" {
		t.Errorf("%s: tokens (-engine alone +cached worker):\n%s", id, diff)
	}
}

// idle waits until no request holds blocks: the pool is free but for the
// blocks charged to the prefix cache's tokens, nothing in the cache is
// pinned, and so every block counts as free.
func idle(t *testing.T, w *testWorker) {
	t.Helper()
	poll.WaitFor(t, "worker idle", func() bool {
		st := w.s.Stats()
		w.s.mu.Lock()
		charged, free := len(w.s.cacheBlocks), w.s.pool.Free()
		w.s.mu.Unlock()
		return st.Requests == 0 && st.PrefixCache.Pinned == 0 && st.KVBlocksFree == st.KVBlocksTotal &&
			charged == w.s.pool.BlocksFor(st.PrefixCache.Tokens) && free+charged == st.KVBlocksTotal
	})
}

// TestPrefixCacheLocalBitExact generates, colocated, prompts sharing
// prefixes of many lengths with earlier ones, block-aligned or not: the
// tokens are the engine's without a cache.
func TestPrefixCacheLocalBitExact(t *testing.T) {
	w := newWorker(t, cachedOptions(1024, 16), true)
	base := prompt(70, 3)
	cases := []struct{ n, shared int }{{70, 70}, {70, 70}, {64, 64}, {40, 15}, {40, 16}, {40, 17}, {50, 32}, {90, 48}, {90, 70}, {33, 0}}
	for i, tc := range cases {
		p := base[:min(tc.n, len(base))]
		if tc.n > len(base) || tc.shared < tc.n {
			p = sharing(base, tc.n, tc.shared, int32(i+5))
		}
		generateLocal(t, w, fmt.Sprintf("l%d", i), p, 6)
	}
	idle(t, w)
	st := w.s.Stats().PrefixCache
	if st.Hits < 7 || st.HitTokens == 0 {
		t.Errorf("cache stats %+v: want hits for the shared prompts", st)
	}
	if len(w.s.PrefixDigest(prefixcache.DefaultDigestHashes)) == 0 {
		t.Error("empty digest")
	}
}

// pushKVFrom is pushKV sending only tokens [start, len(p)), as a prefill
// worker told skip_tokens does; it returns the first token and the ack.
func pushKVFrom(t *testing.T, addr, id string, p []int32, chunk, start int) (int32, kvtransfer.Ack) {
	t.Helper()
	e := newEngine(t)
	ctx := testCtx(t)
	out, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p, Last: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := kvtransfer.NewDialer(kvtransfer.WithConnsPerAddr(1))
	defer d.Close()
	spec := e.Spec()
	snd, err := d.Open(ctx, addr, kvtransfer.StreamHeader{RequestID: id, Codec: "none", Layers: spec.Layers, Tokens: len(p), TokenBytes: spec.KVTokenBytes(), DType: spec.KVDType, Start: start})
	if err != nil {
		t.Fatalf("open transfer: %v", err)
	}
	for s := start; s < len(p); s += chunk {
		end := min(len(p), s+chunk)
		for l := range spec.Layers {
			raw, err := e.ExportKV(1, l, s, end, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := snd.Send(l, s, end, raw, 0); err != nil {
				t.Fatalf("send: %v", err)
			}
		}
	}
	ack, err := snd.Commit(ctx, kvtransfer.Commit{FirstToken: out[0].Token})
	if err != nil {
		t.Fatalf("commit: %v", err)
	}
	return out[0].Token, ack
}

// TestPrefixCacheRemoteSuffixOnly: a decode worker holding a prompt's
// prefix says so at Reserve, receives only the missing tokens' KV (the
// bytes are asserted), and generates the engine's tokens.
func TestPrefixCacheRemoteSuffixOnly(t *testing.T) {
	w := newWorker(t, cachedOptions(1024, 16), true)
	ctx := testCtx(t)
	base := prompt(45, 7)
	generateLocal(t, w, "warm", base, 4) // caches 2 blocks of base
	idle(t, w)
	spec := newEngine(t).Spec()
	for _, tc := range []struct {
		name    string
		p       []int32
		start   int // the transfer's first token: the hit, or 0 (Resend)
		wantHit int
	}{
		{"suffix after two blocks", sharing(base, 60, 40, 11), 32, 32},
		{"one block", sharing(base, 30, 20, 12), 16, 16},
		{"whole prompt despite a hit", sharing(base, 50, 40, 13), 0, 32},
		{"miss", prompt(30, 14), 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := reference(t, tc.p, 7, engine.Sampling{})
			res, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: tc.name, Tokens: int32(len(tc.p) + 7), Prompt: tc.p})
			if err != nil {
				t.Fatal(err)
			}
			if int(res.GetPrefixHitTokens()) != tc.wantHit {
				t.Fatalf("reserve hit %d, want %d", res.GetPrefixHitTokens(), tc.wantHit)
			}
			saved := w.s.Stats().KVBytesSaved
			first, ack := pushKVFrom(t, w.addr, tc.name, tc.p, 8, tc.start)
			if want := int64((len(tc.p) - tc.start) * spec.Layers * spec.KVTokenBytes()); ack.BytesRaw != want {
				t.Errorf("bytes received %d, want %d (tokens [%d, %d))", ack.BytesRaw, want, tc.start, len(tc.p))
			}
			if got := w.s.Stats().KVBytesSaved - saved; got != int64(tc.start*spec.KVBytesPerToken()) {
				t.Errorf("kv bytes saved %d, want %d", got, tc.start*spec.KVBytesPerToken())
			}
			stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: tc.name, PromptTokens: tc.p, MaxTokens: 7, IgnoreEos: true})
			if err != nil {
				t.Fatal(err)
			}
			got, err := collect(stream)
			if err != nil {
				t.Fatal(err)
			}
			if first != want[0] {
				t.Errorf("first token %d, want %d", first, want[0])
			}
			if diff := cmp.Diff(want[1:], got.tokens); diff != "" {
				t.Errorf("tokens (-engine alone +worker):\n%s", diff)
			}
			idle(t, w)
		})
	}
	// A transfer starting anywhere but 0 or the hit is refused.
	p := sharing(base, 50, 40, 15)
	if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "bad", Tokens: 60, Prompt: p}); err != nil {
		t.Fatal(err)
	}
	d := kvtransfer.NewDialer()
	defer d.Close()
	if _, err := d.Open(ctx, w.addr, kvtransfer.StreamHeader{RequestID: "bad", Codec: "none", Layers: spec.Layers, Tokens: len(p), TokenBytes: spec.KVTokenBytes(), DType: spec.KVDType, Start: 16}); err == nil {
		t.Error("transfer from token 16 accepted; the hit is 32")
	}
	if _, err := w.client.Cancel(ctx, &pdservev1.CancelRequest{RequestId: "bad"}); err != nil {
		t.Fatal(err)
	}
	idle(t, w)
}

// TestPrefixCacheDisconnect cancels Generate calls that forked a cached
// prefix, mid-stream and right after Reserve pinned one: the blocks stay
// cached, and unreferenced.
func TestPrefixCacheDisconnect(t *testing.T) {
	w := newWorker(t, cachedOptions(1024, 16), true)
	base := prompt(40, 8)
	generateLocal(t, w, "warm", base, 3)
	idle(t, w)
	before := w.s.Stats().PrefixCache

	ctx, cancel := context.WithCancel(testCtx(t))
	stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "gone", PromptTokens: sharing(base, 48, 40, 9), MaxTokens: 200, LocalPrefill: true, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil { // a token: it forked and runs
		t.Fatal(err)
	}
	cancel()
	if _, err := w.client.Reserve(testCtx(t), &pdservev1.ReserveRequest{RequestId: "pinned", Tokens: 60, Prompt: sharing(base, 40, 33, 10)}); err != nil {
		t.Fatal(err)
	}
	if st := w.s.Stats().PrefixCache; st.Pinned != 1 {
		t.Errorf("after Reserve: %d entries pinned, want 1", st.Pinned)
	}
	if _, err := w.client.Cancel(testCtx(t), &pdservev1.CancelRequest{RequestId: "pinned"}); err != nil {
		t.Fatal(err)
	}
	idle(t, w)
	st := w.s.Stats().PrefixCache
	if st.Entries < before.Entries || st.Pinned != 0 || st.Hits != before.Hits+2 {
		t.Errorf("cache after the disconnects %+v, before %+v: want the entries kept, unpinned", st, before)
	}
	if h := w.s.cache.Match(w.s.cache.Hashes(0, base)); h != 2 {
		t.Errorf("the warm prompt's blocks: %d cached, want 2", h)
	}
}

// TestPrefixCacheConcurrentUnderPressure runs colocated requests sharing
// blocks at once with a cache too small for them, so that entries are
// evicted while others are forked: every result stays bit-exact. Run with
// -race.
func TestPrefixCacheConcurrentUnderPressure(t *testing.T) {
	w := newWorker(t, cachedOptions(96, 2), true)
	bases := [][]int32{prompt(48, 1), prompt(48, 2), prompt(48, 3)}
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			p := sharing(bases[i%3], 40+i, 16*(1+i%3), int32(i+20))
			generateLocal(t, w, fmt.Sprintf("c%d", i), p, 4)
		})
	}
	wg.Wait()
	idle(t, w)
	st := w.s.Stats().PrefixCache
	if st.Entries > 2 || st.Tokens > 96 || st.Evictions == 0 {
		t.Errorf("cache %+v: want within bounds, with evictions", st)
	}
	t.Logf("cache %+v", st)
}

// TestPrefixCacheYieldsToRequests: cached prompts hold pool blocks only
// while no request needs them. A Reserve larger than the free blocks
// reclaims the least recently used unpinned entries (and the scheduler
// frees their engine sequences); a pinned entry is never reclaimed, and a
// Reserve the reclaimable blocks cannot cover fails without evicting
// anything.
func TestPrefixCacheYieldsToRequests(t *testing.T) {
	o := cachedOptions(256*16, 16) // the cache may fill the whole pool
	w := newWorker(t, o, true)
	ctx := testCtx(t)
	var prompts [][]int32
	var seqs []engine.SeqID
	for i := range 5 {
		p := prompt(641, int32(40+i)) // 40 full blocks each
		generateLocal(t, w, fmt.Sprintf("warm%d", i), p, 2)
		idle(t, w)
		h := w.s.cache.Acquire(w.s.cache.Hashes(0, p), 40)
		if h.Tokens != 640 {
			t.Fatalf("warm%d: %d tokens cached, want 640", i, h.Tokens)
		}
		w.s.cache.Release(h)
		prompts, seqs = append(prompts, p), append(seqs, h.Seq)
	}
	w.s.mu.Lock()
	free := w.s.pool.Free()
	w.s.mu.Unlock()
	if free != 256-200 {
		t.Fatalf("pool free %d with 5 prompts of 40 blocks cached, want 56", free)
	}
	// Reserves of 56 blocks (the model's 896-token limit allows no more
	// at once): the first fits the free blocks; the second reclaims the
	// two oldest entries (80 blocks); the third one more.
	for i, want := range []struct{ free, reclaims, entries int }{{40 * 5, 0, 5}, {24 + 3*40, 2, 3}, {8 + 2*40, 3, 2}} {
		res, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: fmt.Sprintf("big%d", i), Tokens: 56 * 16})
		if err != nil {
			t.Fatalf("reserve %d of 56 blocks: %v", i, err)
		}
		st := w.s.Stats().PrefixCache
		if res.GetBlocks() != 56 || int(res.GetBlocksFree()) != want.free || int(st.Reclaims) != want.reclaims || st.Entries != want.entries {
			t.Errorf("reserve %d: %d blocks, %d free, cache %+v; want 56 blocks, %d free (unpinned entries count), %d reclaims, %d entries",
				i, res.GetBlocks(), res.GetBlocksFree(), st, want.free, want.reclaims, want.entries)
		}
	}
	for i, seq := range seqs[:3] {
		poll.WaitFor(t, fmt.Sprintf("warm%d's engine sequence freed", i), func() bool {
			w.s.b.LockEngine()
			defer w.s.b.UnlockEngine()
			_, err := w.s.eng.Len(seq)
			return errors.Is(err, engine.ErrUnknownSeq)
		})
	}
	if n := w.s.cache.Match(w.s.cache.Hashes(0, prompts[4])); n != 40 {
		t.Errorf("newest prompt: %d blocks cached, want 40", n)
	}
	// Pinning the newest entry takes 41 blocks: 8 free, so warm3 goes too.
	res, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "pin", Tokens: 641 + 4, Prompt: prompts[4]})
	if err != nil || res.GetPrefixHitTokens() != 640 {
		t.Fatalf("reserve pinning the newest entry: hit %d, %v", res.GetPrefixHitTokens(), err)
	}
	// 7 blocks free now, nothing reclaimable: 8 blocks fail, evicting nothing.
	if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "too-big", Tokens: 8 * 16}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("reserve of 8 blocks with 7 free and the cache pinned: %v, want RESOURCE_EXHAUSTED", err)
	}
	if st := w.s.Stats().PrefixCache; st.Entries != 1 || st.Reclaims != 4 || st.Pinned != 1 {
		t.Errorf("cache after the refused reserve %+v: want the pinned entry kept, 4 reclaims", st)
	}
	for _, id := range []string{"big0", "big1", "big2", "pin"} {
		if _, err := w.client.Cancel(ctx, &pdservev1.CancelRequest{RequestId: id}); err != nil {
			t.Fatal(err)
		}
	}
	idle(t, w)
}
