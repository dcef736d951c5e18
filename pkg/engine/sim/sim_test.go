package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/enginetest"
	"github.com/pdserve/pdserve/pkg/perfmodel"
	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// fakeClock is a clock that only moves when Sleep is called: Sleep(d)
// advances it by d at once and records d. Safe for concurrent use.
type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	slept []time.Duration
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if d > 0 {
		c.now = c.now.Add(d)
		c.slept = append(c.slept, d)
	}
	return nil
}

// advance moves the clock without a Sleep (time spent elsewhere).
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// total returns the sum of the recorded sleeps and forgets them.
func (c *fakeClock) total() (sum time.Duration, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range c.slept {
		sum += d
	}
	n = len(c.slept)
	c.slept = nil
	return sum, n
}

// newSim returns an engine on a fake clock; opts.Profile defaults to
// OPT-13B on one A100.
func newSim(t testing.TB, opts Options) (*Engine, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	if opts.Profile == "" && opts.ProfileData == nil {
		opts.Profile = "a100-80g/opt-13b/tp1"
	}
	opts.Clock, opts.Sleep = clk.Now, clk.Sleep
	e, err := New(opts)
	if err != nil {
		t.Fatalf("New(%+v): %v", opts, err)
	}
	return e, clk
}

func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"opt-13b", Options{Profile: "a100-80g/opt-13b/tp1", Seed: 1}},
		{"llama-3-8b split chunks", Options{Profile: "h100/llama-3-8b/tp1", Seed: 2, KVChunkTokens: 4, TimeScale: 0.01}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			enginetest.Run(t, func(t *testing.T) engine.Engine {
				e, _ := newSim(t, tc.opts)
				return e
			})
		})
	}
}

func TestSpecIsTheModelsTrueShape(t *testing.T) {
	for _, name := range perfmodel.Names() {
		t.Run(name, func(t *testing.T) {
			e, _ := newSim(t, Options{Profile: name})
			p := e.Profile()
			s := e.Spec()
			if err := s.Validate(); err != nil {
				t.Fatal(err)
			}
			if want := 2 * p.Spec.KVHeads * p.Spec.HeadDim * 2; s.KVTokenBytes() != want {
				t.Errorf("KVTokenBytes = %d, want 2·%d·%d·2 = %d", s.KVTokenBytes(), p.Spec.KVHeads, p.Spec.HeadDim, want)
			}
			if int64(s.KVBytesPerToken()) != p.KVBytesPerToken() {
				t.Errorf("KVBytesPerToken = %d, profile %d", s.KVBytesPerToken(), p.KVBytesPerToken())
			}
			if s.Layers != p.Spec.Layers || s.Heads != p.Spec.Heads || s.MaxSeqLen != p.Spec.MaxSeqLen {
				t.Errorf("spec %+v does not match profile shape %+v", s, p.Spec)
			}
			if s.Vocab != tokenizer.Vocab || s.EOS != tokenizer.EOS || s.BOS != tokenizer.BOS {
				t.Errorf("vocab/BOS/EOS = %d/%d/%d, want the byte tokenizer's", s.Vocab, s.BOS, s.EOS)
			}
			if e.KVTokenBytes() != s.KVTokenBytes() || e.PayloadScale() != 1 {
				t.Errorf("payload scale 1: KVTokenBytes %d (want %d), PayloadScale %v", e.KVTokenBytes(), s.KVTokenBytes(), e.PayloadScale())
			}
		})
	}
}

func TestOptionsErrors(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want error
	}{
		{"unknown profile", Options{Profile: "tpu/opt-13b/tp1"}, perfmodel.ErrUnknownProfile},
		{"no profile", Options{}, perfmodel.ErrUnknownProfile},
		{"negative time scale", Options{Profile: "h100/llama-3-8b/tp1", TimeScale: -1}, ErrOptions},
		{"payload scale > 1", Options{Profile: "h100/llama-3-8b/tp1", PayloadScale: 1.5}, ErrOptions},
		{"negative payload", Options{Profile: "h100/llama-3-8b/tp1", PayloadScale: -0.5}, ErrOptions},
		{"negative chunk tokens", Options{Profile: "h100/llama-3-8b/tp1", KVChunkTokens: -1}, ErrOptions},
		{"invalid profile data", Options{ProfileData: &perfmodel.Profile{Name: "x"}}, perfmodel.ErrInvalidProfile},
		{"missing file", Options{Profile: filepath.Join(t.TempDir(), "absent.json")}, os.ErrNotExist},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.opts); !errors.Is(err, tc.want) {
				t.Errorf("New = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestProfileFromFile(t *testing.T) {
	p, err := perfmodel.Load("h200/llama-3-8b/tp1")
	if err != nil {
		t.Fatal(err)
	}
	p.Roofline.StepOverheadMs = 100 // a user's own calibration
	data, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	fn := filepath.Join(t.TempDir(), "mine.json")
	if err := os.WriteFile(fn, data, 0o600); err != nil {
		t.Fatal(err)
	}
	e, clk := newSim(t, Options{Profile: fn})
	if _, err := e.Decode(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	prefillOne(t, e, 1, tokenizer.Bytes{}.Encode("hello"))
	if got, _ := clk.total(); got < 100*time.Millisecond {
		t.Errorf("step took %v with a 100 ms step overhead from the file", got)
	}
}

func prefillOne(t *testing.T, e *Engine, seq engine.SeqID, toks []int32) int32 {
	t.Helper()
	outs, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: seq, Tokens: toks, Last: true}}, nil)
	if err != nil {
		t.Fatalf("Prefill: %v", err)
	}
	return outs[0].Token
}

func seqTokens(n int, salt uint64) []int32 {
	r := rand.New(rand.NewPCG(salt, 1))
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = int32(r.IntN(256))
	}
	return toks
}

// TestStepTakesModeledTime checks that each kind of step waits exactly the
// profile's step time × TimeScale and counts it in Stats.
func TestStepTakesModeledTime(t *testing.T) {
	ctx := context.Background()
	for _, scale := range []float64{1, 0.25} {
		e, clk := newSim(t, Options{Profile: "a100-80g/opt-13b/tp1", TimeScale: scale})
		p := e.Profile()
		want := func(b perfmodel.Batch) time.Duration { return time.Duration(float64(p.StepTime(b)) * scale) }
		check := func(what string, w time.Duration) {
			t.Helper()
			if got, _ := clk.total(); got != w {
				t.Errorf("scale %v, %s: slept %v, want %v", scale, what, got, w)
			}
		}

		a, b := seqTokens(300, 1), seqTokens(100, 2)
		if _, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: a[:200]}, {Seq: 2, Tokens: b, Last: true}}, nil); err != nil {
			t.Fatal(err)
		}
		check("prefill", want(perfmodel.Batch{Prefill: []int{200, 100}, PrefillContext: []int{0, 0}}))

		// A second chunk is costed after its cached context.
		outs, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: a[200:], Last: true}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		check("second chunk", want(perfmodel.Batch{Prefill: []int{100}, PrefillContext: []int{200}}))

		// Decode context counts the new token.
		if _, err := e.Decode(ctx, []engine.DecodeItem{{Seq: 1, Token: outs[0].Token}, {Seq: 2, Token: 'x'}}); err != nil {
			t.Fatal(err)
		}
		check("decode", want(perfmodel.Batch{Decode: []int{301, 101}}))

		st := e.Stats()
		wantModeled := p.StepTime(perfmodel.Batch{Prefill: []int{200, 100}}) +
			p.StepTime(perfmodel.Batch{Prefill: []int{100}, PrefillContext: []int{200}}) +
			p.StepTime(perfmodel.Batch{Decode: []int{301, 101}})
		if st.Steps != 3 || st.Modeled != wantModeled || st.Scaled != want(perfmodel.Batch{Prefill: []int{200, 100}})+
			want(perfmodel.Batch{Prefill: []int{100}, PrefillContext: []int{200}})+want(perfmodel.Batch{Decode: []int{301, 101}}) || st.Overrun != 0 {
			t.Errorf("scale %v: Stats = %+v, want 3 steps, modeled %v, no overrun", scale, st, wantModeled)
		}
	}
}

// TestKVHandedOutAsLayersFinish: layer l of L is handed out at (l+1)/L of
// the step.
func TestKVHandedOutAsLayersFinish(t *testing.T) {
	e, clk := newSim(t, Options{Profile: "h100/llama-3-8b/tp1", TimeScale: 0.5})
	t0 := clk.Now()
	var at []time.Duration
	toks := seqTokens(64, 3)
	_, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: toks, Last: true}}, func(c engine.KVChunk) error {
		at = append(at, clk.Now().Sub(t0))
		if c.End-c.Start != len(toks) || c.FullBytes != len(c.Data) {
			t.Errorf("chunk %d [%d, %d): %d bytes, FullBytes %d", c.Layer, c.Start, c.End, len(c.Data), c.FullBytes)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	step := time.Duration(float64(e.Profile().PrefillTime([]int{len(toks)})) * 0.5)
	L := e.Spec().Layers
	if len(at) != L {
		t.Fatalf("%d chunks, want %d", len(at), L)
	}
	for l, got := range at {
		if want := time.Duration(int64(step) * int64(l+1) / int64(L)); got != want {
			t.Errorf("layer %d handed out at %v, want %v", l, got, want)
		}
	}
	if got, n := clk.total(); got != step || n != L {
		t.Errorf("slept %v in %d sleeps, want %v in %d", got, n, step, L)
	}
}

// TestOverrunWhenCallbacksAreSlow: time spent in the callback counts
// toward the step (the GPU keeps computing), and only the excess is
// overrun.
func TestOverrunWhenCallbacksAreSlow(t *testing.T) {
	e, clk := newSim(t, Options{Profile: "h100/llama-3-8b/tp1"})
	step := e.Profile().PrefillTime([]int{8})
	perLayer := step / 4 // 32 layers: the callbacks alone take 8 steps' time
	_, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: seqTokens(8, 4), Last: true}}, func(engine.KVChunk) error {
		clk.advance(perLayer)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Layer 0 waits 1/32 of the step; every later layer is already late.
	slept, n := clk.total()
	if want := step / 32; slept != want || n != 1 {
		t.Errorf("slept %v in %d sleeps, want %v in 1", slept, n, want)
	}
	if got, want := e.Stats().Overrun, step/32+32*perLayer-step; got != want {
		t.Errorf("Overrun = %v, want %v", got, want)
	}
}

// TestInterference: a step that carries a 2k-token prefill chunk beside a
// decode batch takes longer than the decode step alone, by what the
// profile predicts for the mixed batch. Two engines in the same state run
// the two alternatives.
func TestInterference(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"a100-80g/opt-13b/tp1", "h100/llama-3-8b/tp1"} {
		t.Run(name, func(t *testing.T) {
			const n = 8
			setup := func() (*Engine, *fakeClock, []engine.DecodeItem) {
				e, clk := newSim(t, Options{Profile: name})
				decode := make([]engine.DecodeItem, n)
				for i := range decode {
					seq := engine.SeqID(i + 1)
					decode[i] = engine.DecodeItem{Seq: seq, Token: prefillOne(t, e, seq, seqTokens(100, uint64(i)))}
				}
				clk.total()
				return e, clk, decode
			}
			alone, aloneClk, decode := setup()
			if _, err := alone.Decode(ctx, decode); err != nil {
				t.Fatal(err)
			}
			mixed, mixedClk, decode := setup()
			chunk := seqTokens(2048, 99)
			if _, _, err := mixed.Step(ctx, []engine.PrefillItem{{Seq: 100, Tokens: chunk, Last: true}}, decode, nil); err != nil {
				t.Fatal(err)
			}
			tAlone, _ := aloneClk.total()
			tMixed, _ := mixedClk.total()

			p := alone.Profile()
			ctxLens := make([]int, n)
			for i := range ctxLens {
				ctxLens[i] = 101 // 100 prompt tokens + the decoded one
			}
			decodeOnly := perfmodel.Batch{Decode: ctxLens}
			withChunk := perfmodel.Batch{Prefill: []int{2048}, PrefillContext: []int{0}, Decode: ctxLens}
			if tAlone != p.StepTime(decodeOnly) || tMixed != p.StepTime(withChunk) {
				t.Errorf("steps took %v and %v, profile says %v and %v", tAlone, tMixed, p.StepTime(decodeOnly), p.StepTime(withChunk))
			}
			predicted := p.StepTime(withChunk) - p.StepTime(decodeOnly)
			if tMixed-tAlone != predicted || predicted <= 0 {
				t.Errorf("the chunk added %v to the decode step, the model predicts %v (> 0)", tMixed-tAlone, predicted)
			}
			t.Logf("%s: decode of %d alone %v, with a 2048-token chunk %v (+%v)", name, n, tAlone, tMixed, predicted)
		})
	}
}

func TestTokensArePrintableAndIndependentOfSeqID(t *testing.T) {
	e, _ := newSim(t, Options{})
	f, _ := newSim(t, Options{Seed: 42, PayloadScale: 0.5}) // KV options do not change tokens
	prompt := tokenizer.Bytes{}.Encode("The quick brown fox jumps over the lazy dog")
	gen := func(e *Engine, seq engine.SeqID) string {
		tok := prefillOne(t, e, seq, prompt)
		out := []int32{tok}
		for range 40 {
			outs, err := e.Decode(context.Background(), []engine.DecodeItem{{Seq: seq, Token: tok}})
			if err != nil {
				t.Fatal(err)
			}
			tok = outs[0].Token
			out = append(out, tok)
		}
		for _, id := range out {
			if id < 32 || id > 126 {
				t.Fatalf("token %d is not a printable byte", id)
			}
		}
		return tokenizer.Bytes{}.Decode(out)
	}
	a, b, c := gen(e, 1), gen(e, 999), gen(f, 5)
	if a != b || a != c {
		t.Errorf("same prompt, different seq ids or KV options: %q, %q, %q", a, b, c)
	}
	prompt = tokenizer.Bytes{}.Encode("Another prompt entirely")
	if d := gen(e, 2); d == a {
		t.Errorf("different prompts generate the same text %q", d)
	}
	t.Logf("generated: %q", a)
}

func TestPayloadScale(t *testing.T) {
	ctx := context.Background()
	a, _ := newSim(t, Options{PayloadScale: 0.1})
	b, _ := newSim(t, Options{PayloadScale: 0.1})
	full, _ := newSim(t, Options{})
	spec := a.Spec()
	// OPT-13B: 40 heads × 128 = 5120 values per row; 10% = 512.
	if got, want := a.KVTokenBytes(), 2*2*512; got != want {
		t.Fatalf("KVTokenBytes = %d, want %d", got, want)
	}
	if got := a.PayloadScale(); got != 0.1 {
		t.Errorf("PayloadScale = %v, want 0.1", got)
	}
	toks := seqTokens(33, 5)
	var chunks, raw, fullBytes int
	outs, err := a.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: toks, Last: true}}, func(c engine.KVChunk) error {
		chunks++
		raw += len(c.Data)
		fullBytes += c.Bytes()
		if c.FullBytes != spec.KVChunkBytes(c.End-c.Start) || len(c.Data) != (c.End-c.Start)*a.KVTokenBytes() {
			t.Errorf("layer %d: len(Data) %d, FullBytes %d; want %d and %d", c.Layer, len(c.Data), c.FullBytes, (c.End-c.Start)*a.KVTokenBytes(), spec.KVChunkBytes(c.End-c.Start))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := spec.Layers * len(toks) * spec.KVTokenBytes(); fullBytes != want || raw*10 != want {
		t.Errorf("handed out %d bytes standing for %d, want %d standing for %d", raw, fullBytes, want/10, want)
	}
	// Export → import between scaled engines: same bytes, same tokens,
	// nothing stored verbatim.
	for l := range spec.Layers {
		data, err := a.ExportKV(1, l, 0, len(toks), nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(data) != len(toks)*a.KVTokenBytes() {
			t.Fatalf("ExportKV = %d bytes, want the scaled %d", len(data), len(toks)*a.KVTokenBytes())
		}
		if err := b.ImportKV(7, l, 0, data); err != nil {
			t.Fatal(err)
		}
		if err := b.ImportKV(8, l, 0, data[:len(data)-1]); !errors.Is(err, engine.ErrRange) {
			t.Fatalf("partial scaled token: %v, want ErrRange", err)
		}
	}
	if b.seqs[7].foreign != nil {
		t.Errorf("KV from an engine with the same options was stored verbatim instead of regenerated")
	}
	want := decodeN(t, full, 1, prefillOne(t, full, 1, toks), 10)
	if got := decodeN(t, b, 7, outs[0].Token, 10); !cmp.Equal(want, got) {
		t.Errorf("tokens after a scaled import differ from a full-size engine's:\n%s", cmp.Diff(want, got))
	}
}

func decodeN(t *testing.T, e *Engine, seq engine.SeqID, tok int32, n int) []int32 {
	t.Helper()
	var out []int32
	for range n {
		outs, err := e.Decode(context.Background(), []engine.DecodeItem{{Seq: seq, Token: tok}})
		if err != nil {
			t.Fatal(err)
		}
		tok = outs[0].Token
		out = append(out, tok)
	}
	return out
}

func TestForeignKVIsKeptVerbatim(t *testing.T) {
	e, _ := newSim(t, Options{Profile: "h100/llama-3-8b/tp1"})
	other, _ := newSim(t, Options{Profile: "h100/llama-3-8b/tp1", Seed: 77}) // another pattern
	spec := e.Spec()
	toks := seqTokens(12, 6)
	first := prefillOne(t, other, 1, toks)
	r := rand.New(rand.NewPCG(1, 2))
	for l := range spec.Layers {
		data, err := other.ExportKV(1, l, 0, len(toks), nil)
		if err != nil {
			t.Fatal(err)
		}
		if l == 3 { // one layer of noise
			for i := range data {
				data[i] = byte(r.Uint32())
			}
		}
		// Import in two pieces to exercise spans.
		if err := e.ImportKV(1, l, 0, sliceTokens(data, len(toks), 0, 5, spec.KVTokenBytes())); err != nil {
			t.Fatal(err)
		}
		if err := e.ImportKV(1, l, 5, sliceTokens(data, len(toks), 5, len(toks), spec.KVTokenBytes())); err != nil {
			t.Fatal(err)
		}
		for _, rg := range [][2]int{{0, 12}, {3, 9}, {5, 6}, {0, 5}} {
			got, err := e.ExportKV(1, l, rg[0], rg[1], nil)
			if err != nil {
				t.Fatal(err)
			}
			want := sliceTokens(data, len(toks), rg[0], rg[1], spec.KVTokenBytes())
			if !bytes.Equal(got, want) {
				t.Fatalf("layer %d [%d, %d): export differs from the imported bytes", l, rg[0], rg[1])
			}
		}
	}
	// The content keys travelled with layer 0, so the continuation matches
	// the source engine's (tokens do not depend on the KV pattern).
	if diff := cmp.Diff(decodeN(t, other, 1, first, 6), decodeN(t, e, 1, first, 6)); diff != "" {
		t.Errorf("continuation differs (-source +importer):\n%s", diff)
	}
	// Decoded tokens regenerate: export still works past the imported part.
	if _, err := e.ExportKV(1, 0, 0, len(toks)+6, nil); err != nil {
		t.Fatal(err)
	}
}

// sliceTokens cuts tokens [start, end) out of a layer slice of n tokens.
func sliceTokens(data []byte, n, start, end, tokenBytes int) []byte {
	row := tokenBytes / 2
	out := append([]byte(nil), data[start*row:end*row]...)
	return append(out, data[(n+start)*row:(n+end)*row]...)
}

// TestNoKVHeldInMemory: a long OPT-13B sequence (800 KB of true KV per
// token) costs the engine its keys only.
func TestNoKVHeldInMemory(t *testing.T) {
	e, _ := newSim(t, Options{})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for seq := range engine.SeqID(4) {
		prefillOne(t, e, seq, seqTokens(2000, uint64(seq)))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	trueKV := 4 * 2000 * e.Profile().KVBytesPerToken() // 6.5 GB
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if grew > 4<<20 {
		t.Errorf("heap grew %d bytes for %d bytes of true KV", grew, trueKV)
	}
	for seq, st := range e.seqs {
		if st.foreign != nil || len(st.keys) != 2000 {
			t.Errorf("seq %d holds %d keys and foreign %v", seq, len(st.keys), st.foreign != nil)
		}
	}
}

func TestCancelledWhileWaiting(t *testing.T) {
	e, err := New(Options{Profile: "a100-80g/opt-13b/tp1", TimeScale: 1000}) // real timer, a long step
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: seqTokens(10, 1), Last: true}}, nil)
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Prefill = %v, want context.Canceled", err)
	}
	if _, err := e.Len(1); !errors.Is(err, engine.ErrUnknownSeq) {
		t.Errorf("cancelled first prefill left the sequence: %v", err)
	}
	if st := e.Stats(); st.Steps != 0 {
		t.Errorf("a cancelled step was counted: %+v", st)
	}
}

func TestPacer(t *testing.T) {
	ctx := context.Background()
	e, clk := newSim(t, Options{Profile: "h100/llama-3-8b/tp1", TimeScale: 0.5})
	p, err := e.NewPacer(1e9) // 1 GB/s, at half time
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(ctx, 2e6); err != nil {
		t.Fatal(err)
	}
	if got, _ := clk.total(); got != time.Millisecond {
		t.Errorf("2 MB at 1 GB/s × 0.5: waited %v, want 1ms", got)
	}
	// Back-to-back reservations queue on the link.
	clk.advance(-time.Millisecond / 2) // a second sender arrives while the first is on the link
	if err := p.Wait(ctx, 2e6); err != nil {
		t.Fatal(err)
	}
	if got, _ := clk.total(); got != 1500*time.Microsecond {
		t.Errorf("queued reservation waited %v, want 1.5ms", got)
	}
	// An idle link starts afresh.
	clk.advance(time.Second)
	if err := p.Wait(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if got, n := clk.total(); got != 0 || n != 0 {
		t.Errorf("empty reservation on an idle link waited %v", got)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := p.Wait(cctx, 1e6); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait(cancelled) = %v", err)
	}
	for _, bw := range []float64{0, -1} {
		if _, err := e.NewPacer(bw); !errors.Is(err, ErrOptions) {
			t.Errorf("NewPacer(%v) = %v, want ErrOptions", bw, err)
		}
	}
}

// TestPacerChargesFullSize: streaming a scaled-down prefill through a
// pacer by KVChunk.Bytes takes the true size's time over the link, and the
// transfer overlaps the step as layers finish.
func TestPacerChargesFullSize(t *testing.T) {
	e, clk := newSim(t, Options{Profile: "h200/llama-3-70b/tp4", PayloadScale: 0.05})
	const link = 100e9 / 8 // 100 Gb/s
	p, err := e.NewPacer(link)
	if err != nil {
		t.Fatal(err)
	}
	toks := seqTokens(256, 7)
	var raw int64
	t0 := clk.Now()
	_, err = e.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: toks, Last: true}}, func(c engine.KVChunk) error {
		raw += int64(len(c.Data))
		return p.Wait(context.Background(), c.Bytes())
	})
	if err != nil {
		t.Fatal(err)
	}
	elapsed := clk.Now().Sub(t0)
	// 8 KV heads × 128 = 1024 values per row; 5% rounds to 48.
	full := int64(len(toks)) * e.Profile().KVBytesPerToken()
	if raw*1024 != full*48 {
		t.Errorf("handed out %d bytes for %d true bytes, want 48/1024 of it", raw, full)
	}
	step := e.Profile().PrefillTime([]int{len(toks)})
	transfer := e.Profile().KVTransferTime(len(toks), link)
	if transfer >= step {
		t.Fatalf("test assumes the transfer (%v) hides behind the step (%v)", transfer, step)
	}
	// Each layer crosses the link while later layers compute; only the
	// last layer's transfer shows after the step.
	want := step + transfer/time.Duration(e.Spec().Layers)
	if d := elapsed - want; d < -time.Microsecond || d > time.Microsecond {
		t.Errorf("prefill + paced transfer took %v, want step %v + one layer's transfer = %v", elapsed, step, want)
	}
}

// BenchmarkPrefillHandOut measures the CPU an OPT-13B prefill of 512
// tokens costs the engine (sleeping faked): KV synthesis for 40 layers at
// full and at 5% payload. Compare bytes/s with BenchmarkCopyKV.
func BenchmarkPrefillHandOut(b *testing.B) {
	for _, scale := range []float64{1, 0.05} {
		b.Run(fmt.Sprintf("payload=%v", scale), func(b *testing.B) {
			e, _ := newSim(b, Options{PayloadScale: scale})
			toks := seqTokens(512, 1)
			var handed int64
			onKV := func(c engine.KVChunk) error { handed += int64(len(c.Data)); return nil }
			ctx := context.Background()
			for b.Loop() {
				if _, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: toks, Last: true}}, onKV); err != nil {
					b.Fatal(err)
				}
				e.Free(1)
			}
			b.SetBytes(handed / int64(b.N))
		})
	}
}
