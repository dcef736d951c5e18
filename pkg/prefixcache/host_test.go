package prefixcache_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/llamacpp"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/engine/sim"
	"github.com/pdserve/pdserve/pkg/gguf"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// tokens returns n token ids below vocab from seed, the first shared of
// them base's.
func tokens(base []int32, n, shared int, seed, vocab int32) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = 3 + (int32(i)*7+seed*13+int32(i*i)%11)%(vocab-3)
	}
	copy(p, base[:min(shared, n, len(base))])
	for i := min(shared, len(base)); i < n && i < len(base); i++ {
		if p[i] == base[i] {
			p[i] = 3 + (p[i]-2)%(vocab-3)
		}
	}
	return p
}

// run prefills prompt into a new seq after its first from tokens (KV the
// sequence holds already) and decodes steps more greedily; it returns the
// sampled tokens.
func run(t testing.TB, eng engine.Engine, seq engine.SeqID, prompt []int32, from, steps int) []int32 {
	t.Helper()
	ctx := context.Background()
	out, err := eng.Prefill(ctx, []engine.PrefillItem{{Seq: seq, Tokens: prompt[from:], Last: true}}, nil)
	if err != nil {
		t.Fatalf("prefill seq %d from %d: %v", seq, from, err)
	}
	got := []int32{out[0].Token}
	for range steps {
		out, err := eng.Decode(ctx, []engine.DecodeItem{{Seq: seq, Token: got[len(got)-1]}})
		if err != nil {
			t.Fatalf("decode seq %d: %v", seq, err)
		}
		got = append(got, out[0].Token)
	}
	return got
}

// exportAll returns seq's KV of tokens [0, n), every layer.
func exportAll(t testing.TB, eng engine.Engine, seq engine.SeqID, n int) [][]byte {
	t.Helper()
	var kv [][]byte
	for l := range eng.Spec().Layers {
		b, err := eng.ExportKV(seq, l, 0, n, nil)
		if err != nil {
			t.Fatal(err)
		}
		kv = append(kv, b)
	}
	return kv
}

// matchesCold runs prompt p in warm, a sequence holding its first from
// tokens loaded from a cache (what), and again in cold from scratch, and
// checks that the tokens (and, when kvExact, every layer's KV) are the
// same; it frees both.
func matchesCold(t *testing.T, eng engine.Engine, warm, cold engine.SeqID, p []int32, from int, kvExact bool, what string) {
	t.Helper()
	got := run(t, eng, warm, p, from, 6)
	if want := run(t, eng, cold, p, 0, 6); !slices.Equal(got, want) {
		t.Errorf("tokens after %s %v, cold run %v", what, got, want)
	}
	if kvExact {
		gk, wk := exportAll(t, eng, warm, len(p)), exportAll(t, eng, cold, len(p))
		for l := range gk {
			if !bytes.Equal(gk[l], wk[l]) {
				t.Errorf("layer %d: KV after %s differs from the cold run's", l, what)
			}
		}
	}
	eng.Free(warm)
	eng.Free(cold)
}

// hostRoundTrip caches a prompt, evicts it to the host tier with a second
// one, and runs prompts sharing its prefix, block-aligned or not: each
// loads the shared whole blocks from the host, and its tokens (and, when
// kvExact, its KV) equal a cold run's.
func hostRoundTrip(t *testing.T, eng engine.Engine, kvExact bool) {
	const bt = 16
	vocab := int32(min(eng.Spec().Vocab, 250))
	c, err := prefixcache.New(prefixcache.Options{MaxTokens: 1 << 12, MaxEntries: 1, BlockTokens: bt, HostBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	free := func(seqs []engine.SeqID) {
		t.Helper()
		if err := c.Free(eng, seqs); err != nil {
			t.Fatal(err)
		}
	}
	base := tokens(nil, 70, 0, 1, vocab)
	run(t, eng, 1, base, 0, 0)
	free(c.Insert(1, c.Hashes(0, base), len(base)))
	other := tokens(nil, 40, 0, 2, vocab)
	run(t, eng, 2, other, 0, 0)
	free(c.Insert(2, c.Hashes(0, other), len(other)))
	if _, err := eng.Len(1); !errors.Is(err, engine.ErrUnknownSeq) {
		t.Fatalf("evicted seq 1 still in the engine: %v", err)
	}
	if st := c.Stats().Host; st.Spills != 1 || st.Entries != 1 || st.Blocks != 4 || st.Bytes != int64(64*eng.Spec().KVBytesPerToken()) {
		t.Fatalf("host tier after one eviction: %+v, want 1 entry of 4 blocks", st)
	}
	seq := engine.SeqID(10)
	for _, tc := range []struct{ n, shared, want int }{
		{70, 70, 64}, // the prompt again: all but the partial block
		{60, 48, 48}, // block-aligned
		{50, 40, 32}, // not aligned: the whole blocks
		{64, 64, 48}, // all 4 blocks cached: the last is computed
		{30, 10, 0},  // no whole block: a miss
	} {
		t.Run(fmt.Sprintf("n%d-shared%d", tc.n, tc.shared), func(t *testing.T) {
			p := tokens(base, tc.n, tc.shared, int32(tc.n+tc.shared), vocab)
			hashes := c.Hashes(0, p)
			maxHit := c.MaxHitBlocks(len(p))
			if got := c.HostDeeper(hashes, maxHit, nil); got != (tc.want > 0) {
				t.Errorf("HostDeeper = %v, want %v", got, tc.want > 0)
			}
			seq++
			warm := seq
			ld, err := c.Host().Load(eng, warm, hashes, maxHit, nil)
			if err != nil {
				t.Fatal(err)
			}
			if ld.Tokens != tc.want || ld.Bytes != int64(tc.want*eng.Spec().KVBytesPerToken()) {
				t.Fatalf("Load = %+v, want %d tokens", ld, tc.want)
			}
			seq++
			matchesCold(t, eng, warm, seq, p, ld.Tokens, kvExact, "a host load")
		})
	}
	st := c.Stats().Host
	if st.Lookups != 5 || st.Hits != 4 || st.HitTokens != 64+48+32+48 {
		t.Errorf("host tier stats %+v: want 5 lookups, 4 hits of 192 tokens", st)
	}
	free(c.Drain())
}

func TestHostTierRef(t *testing.T) {
	eng, err := ref.New(ref.Options{Preset: "tiny", MaxSeqLen: 512})
	if err != nil {
		t.Fatal(err)
	}
	hostRoundTrip(t, eng, true)
}

func TestHostTierSim(t *testing.T) {
	eng, err := sim.New(sim.Options{Profile: "h100/llama-3-8b/tp1", TimeScale: 1e-6, PayloadScale: 1.0 / 16})
	if err != nil {
		t.Fatal(err)
	}
	hostRoundTrip(t, eng, true)
	if st := eng.Stats(); st.HostLoad <= 0 {
		t.Errorf("sim stats %+v: no host-link time charged for the loads", st)
	}
}

func TestHostTierLlamaCpp(t *testing.T) {
	lib, vocab := repotest.Llama(t)
	path := filepath.Join(t.TempDir(), "tiny-llama.gguf")
	if err := gguf.WriteRandom(path, gguf.RandomOptions{Arch: "llama", Vocab: filepath.Join(vocab, "ggml-vocab-llama-spm.gguf"),
		Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Context: 1024, Type: gguf.F32, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	eng, err := llamacpp.New(llamacpp.Options{LibDir: lib, Model: path, CtxSize: 1024, MaxSeqs: 8, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	if err := eng.Transferable(); err != nil {
		t.Skipf("llama.cpp KV export unavailable: %v", err)
	}
	hostRoundTrip(t, eng, false)
}

// TestHostTierEvictionUnderPressure runs prompts from several goroutines
// through one engine (under its lock, as a worker's scheduler holds it)
// and a host tier of five prompts, while another goroutine reads the
// stats, as metrics do: the budget holds throughout, entries are
// evicted, every load is token-exact. Run with -race.
func TestHostTierEvictionUnderPressure(t *testing.T) {
	eng, err := ref.New(ref.Options{Preset: "tiny", MaxSeqLen: 256})
	if err != nil {
		t.Fatal(err)
	}
	budget := int64(5 * 48 * eng.Spec().KVBytesPerToken()) // five prompts of 3 blocks
	c, err := prefixcache.New(prefixcache.Options{MaxTokens: 96, MaxEntries: 1, BlockTokens: 16, HostBytes: budget})
	if err != nil {
		t.Fatal(err)
	}
	var engMu sync.Mutex
	done := make(chan struct{})
	var readers sync.WaitGroup
	readers.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if st := c.Stats().Host; st.Bytes > budget {
				t.Errorf("host tier holds %d bytes > budget %d", st.Bytes, budget)
				return
			}
		}
	})
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			for i := range 10 {
				seq := engine.SeqID(100*w + 2*i + 1)
				// Three hot prompts between ones of their own.
				seed := int32(i % 3)
				if i%2 == 1 {
					seed = int32(10 + 10*w + i)
				}
				p := tokens(nil, 50, 0, seed, 250)
				hashes := c.Hashes(0, p)
				engMu.Lock()
				ld, err := c.Host().Load(eng, seq, hashes, c.MaxHitBlocks(len(p)), nil)
				if err != nil {
					t.Error(err)
				}
				got := run(t, eng, seq, p, ld.Tokens, 2)
				want := run(t, eng, seq+1, p, 0, 2)
				eng.Free(seq + 1)
				if !slices.Equal(got, want) {
					t.Errorf("worker %d prompt %d: tokens %v after loading %d, cold %v", w, i, got, ld.Tokens, want)
				}
				if err := c.Free(eng, c.Insert(seq, hashes, len(p))); err != nil {
					t.Error(err)
				}
				engMu.Unlock()
			}
		})
	}
	wg.Wait()
	close(done)
	readers.Wait()
	st := c.Stats().Host
	if st.Evictions == 0 || st.Hits == 0 || st.Bytes > budget {
		t.Errorf("host tier stats %+v: want evictions and hits within %d bytes", st, budget)
	}
	if err := c.Free(eng, c.Drain()); err != nil {
		t.Error(err)
	}
	t.Logf("host tier stats %+v", st)
}

// setObserver records a tier's reports as a set.
type setObserver map[kv.Hash]bool

func (o setObserver) Stored(h kv.Hash)  { o[h] = true }
func (o setObserver) Removed(h kv.Hash) { delete(o, h) }

// TestHostTierObserver: replaying the host tier's reports (spills,
// supersessions, evictions) gives AppendBlocks' list.
func TestHostTierObserver(t *testing.T) {
	eng, err := ref.New(ref.Options{Preset: "tiny", MaxSeqLen: 256})
	if err != nil {
		t.Fatal(err)
	}
	c, err := prefixcache.New(prefixcache.Options{MaxTokens: 1 << 10, MaxEntries: 1, BlockTokens: 16, HostBytes: int64(100 * eng.Spec().KVBytesPerToken())})
	if err != nil {
		t.Fatal(err)
	}
	obs := setObserver{}
	c.Host().SetObserver(obs)
	base := tokens(nil, 64, 0, 1, 250)
	for i, p := range [][]int32{base[:33], tokens(nil, 50, 0, 2, 250), base, tokens(base, 60, 40, 3, 250), tokens(nil, 40, 0, 4, 250)} {
		seq := engine.SeqID(i + 1)
		run(t, eng, seq, p, 0, 0)
		if err := c.Free(eng, c.Insert(seq, c.Hashes(0, p), len(p))); err != nil {
			t.Fatal(err)
		}
		var got []uint64
		marked := false
		got = c.Host().AppendBlocks(got, func() { marked = true })
		want := make([]uint64, 0, len(obs))
		for h := range obs {
			want = append(want, uint64(h))
		}
		slices.Sort(got)
		slices.Sort(want)
		if !marked || !slices.Equal(got, want) {
			t.Errorf("after prompt %d: AppendBlocks %v, replayed reports %v", i, got, want)
		}
	}
	if st := c.Stats().Host; st.Superseded == 0 || st.Evictions == 0 {
		t.Errorf("host stats %+v: want a supersession and an eviction reported", st)
	}
	if err := c.Free(eng, c.Drain()); err != nil {
		t.Fatal(err)
	}
}

// dmaEngine is a ref engine that models spills as a DMA (SpillLinked):
// every copy out ends at ready, and a load that waits for it waits wait.
type dmaEngine struct {
	engine.Engine
	ready   time.Time
	wait    time.Duration
	charged []int64
	waited  []time.Time
}

func (d *dmaEngine) ChargeHostSpill(bytes int64) time.Time {
	d.charged = append(d.charged, bytes)
	return d.ready
}

func (d *dmaEngine) WaitHostSpill(ready time.Time) time.Duration {
	d.waited = append(d.waited, ready)
	return d.wait
}

// TestHostTierSpillDMA: on a SpillLinked engine a spill charges its true
// KV size to the link, and a load of the entry waits for the copy's end,
// the wait in its Took; the tokens are the cold run's.
func TestHostTierSpillDMA(t *testing.T) {
	base, err := ref.New(ref.Options{Preset: "tiny", MaxSeqLen: 256})
	if err != nil {
		t.Fatal(err)
	}
	eng := &dmaEngine{Engine: base, ready: time.Unix(1000, 0), wait: time.Hour}
	c, err := prefixcache.New(prefixcache.Options{MaxTokens: 1 << 10, MaxEntries: 4, BlockTokens: 16, HostBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	p := tokens(nil, 50, 0, 1, int32(min(eng.Spec().Vocab, 250)))
	cold := run(t, eng, 1, p, 0, 3)
	hashes := c.Hashes(0, p)
	if err := c.Host().Spill(eng, 1, hashes); err != nil {
		t.Fatal(err)
	}
	eng.Free(1)
	if want := []int64{48 * int64(eng.Spec().KVBytesPerToken())}; !slices.Equal(eng.charged, want) {
		t.Fatalf("spill charged %v bytes, want %v", eng.charged, want)
	}
	ld, err := c.Host().Load(eng, 2, hashes, c.MaxHitBlocks(len(p)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if ld.Tokens != 48 || ld.Took < time.Hour || !slices.Equal(eng.waited, []time.Time{eng.ready}) {
		t.Fatalf("load %+v, waited for %v; want 48 tokens, a Took of the hour's wait, one wait for %v", ld, eng.waited, eng.ready)
	}
	if got := run(t, eng, 2, p, ld.Tokens, 3); !slices.Equal(got, cold) {
		t.Errorf("after the load: tokens %v, want the cold run's %v", got, cold)
	}
}
