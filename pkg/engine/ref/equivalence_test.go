package ref_test

import (
	"context"
	"flag"
	"fmt"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// newEngine returns an engine closed when t ends.
func newEngine(t testing.TB, preset string, threads int) *ref.Engine {
	t.Helper()
	e, err := ref.New(ref.Options{Preset: preset, Seed: 1, Threads: threads})
	if err != nil {
		t.Fatalf("ref.New(%s): %v", preset, err)
	}
	t.Cleanup(e.Close)
	return e
}

var withSmall = flag.Bool("small", false, "also run the equivalence and lossy-codec tests on the small preset (tens of seconds)")

// equivalencePresets are the presets the bitwise equivalences run on:
// tiny always, small with -small (its 28 M parameters take tens of
// seconds on two cores).
func equivalencePresets() []string {
	if *withSmall {
		return []string{"tiny", "small"}
	}
	return []string{"tiny"}
}

// request is one sequence of a test workload.
type request struct {
	seq      engine.SeqID
	prompt   []int32
	sampling engine.Sampling
}

// trace is what a request produced: every sampled token and the logits it
// was sampled from (copied).
type trace struct {
	tokens []int32
	logits [][]float32
}

func (tr *trace) add(o engine.Output) {
	tr.tokens = append(tr.tokens, o.Token)
	tr.logits = append(tr.logits, append([]float32(nil), o.Logits...))
}

// workload returns requests with prompts of varied lengths and contents,
// greedy except one seeded sampler.
func workload(e engine.Engine) []request {
	tok := e.Tokenizer()
	texts := []string{
		"Hello",
		"The quick brown fox jumps over the lazy dog.",
		"x",
		"In a disaggregated deployment, the prefill worker computes the KV cache of the whole prompt and streams it to a decode worker.",
		"0123456789 0123456789 0123456789",
	}
	reqs := make([]request, len(texts))
	for i, s := range texts {
		reqs[i] = request{seq: engine.SeqID(100 + i), prompt: tok.Encode(s)}
	}
	reqs[1].sampling = engine.Sampling{Temperature: 0.8, TopP: 0.9, Seed: 77}
	return reqs
}

// prefillAll prefills every request in one batch and records the first
// tokens.
func prefillAll(t *testing.T, e engine.Engine, reqs []request, traces map[engine.SeqID]*trace) {
	t.Helper()
	items := make([]engine.PrefillItem, len(reqs))
	for i, r := range reqs {
		items[i] = engine.PrefillItem{Seq: r.seq, Tokens: r.prompt, Sampling: r.sampling, Last: true}
	}
	outs, err := e.Prefill(context.Background(), items, nil)
	if err != nil {
		t.Fatalf("Prefill: %v", err)
	}
	for _, o := range outs {
		traces[o.Seq].add(o)
	}
}

// decodeAll runs steps decode steps over every request in one batch, in the
// order given, appending to traces.
func decodeAll(t *testing.T, e engine.Engine, reqs []request, traces map[engine.SeqID]*trace, steps int) {
	t.Helper()
	for step := range steps {
		batch := make([]engine.DecodeItem, len(reqs))
		for i, r := range reqs {
			tr := traces[r.seq]
			batch[i] = engine.DecodeItem{Seq: r.seq, Token: tr.tokens[len(tr.tokens)-1], Sampling: r.sampling}
		}
		outs, err := e.Decode(context.Background(), batch)
		if err != nil {
			t.Fatalf("Decode step %d: %v", step, err)
		}
		for _, o := range outs {
			traces[o.Seq].add(o)
		}
	}
}

func newTraces(reqs []request) map[engine.SeqID]*trace {
	m := make(map[engine.SeqID]*trace, len(reqs))
	for _, r := range reqs {
		m[r.seq] = &trace{}
	}
	return m
}

// bitwise compares float32s by their bits.
var bitwise = cmp.Comparer(func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) })

// sameTraces fails unless got equals want in tokens and logits, bit for bit.
func sameTraces(t *testing.T, what string, want, got map[engine.SeqID]*trace) {
	t.Helper()
	for seq, w := range want {
		g := got[seq]
		if diff := cmp.Diff(w.tokens, g.tokens); diff != "" {
			t.Errorf("%s: seq %d tokens differ (-want +got):\n%s", what, seq, diff)
			continue
		}
		for i := range w.logits {
			if len(w.logits[i]) == 0 {
				t.Fatalf("%s: seq %d step %d: no logits", what, seq, i)
			}
			if !cmp.Equal(w.logits[i], g.logits[i], bitwise) {
				t.Errorf("%s: seq %d step %d: logits differ (max |Δ| %g)", what, seq, i, maxAbsDiff(w.logits[i], g.logits[i]))
				break
			}
		}
	}
}

func maxAbsDiff(a, b []float32) float64 {
	m := 0.0
	for i := range a {
		m = max(m, math.Abs(float64(a[i])-float64(b[i])))
	}
	return m
}

// transfer moves seq's KV from a to b as a prefill worker would send it:
// per layer, in frames of blockTokens tokens, each through c's frame round
// trip. It returns the raw and wire byte counts.
func transfer(t *testing.T, a, b engine.Engine, seq engine.SeqID, c codec.Codec, blockTokens int) (raw, wire int) {
	t.Helper()
	spec := a.Spec()
	n, err := a.Len(seq)
	if err != nil {
		t.Fatalf("Len: %v", err)
	}
	var kv, frame, got []byte
	for l := range spec.Layers {
		for start := 0; start < n; start += blockTokens {
			end := min(start+blockTokens, n)
			kv, err = a.ExportKV(seq, l, start, end, kv[:0])
			if err != nil {
				t.Fatalf("ExportKV(layer %d, [%d, %d)): %v", l, start, end, err)
			}
			h := codec.Header{RequestID: fmt.Sprintf("req-%d", seq), Layer: uint32(l), Start: uint32(start), End: uint32(end), DType: spec.KVDType}
			frame, err = codec.AppendFrame(frame[:0], h, c, kv)
			if err != nil {
				t.Fatalf("%s: AppendFrame: %v", c.Name(), err)
			}
			var gotH codec.Header
			var used int
			gotH, got, used, err = codec.DecodeFrame(got[:0], frame, len(kv))
			if err != nil {
				t.Fatalf("%s: DecodeFrame: %v", c.Name(), err)
			}
			if used != len(frame) || gotH.Layer != h.Layer || gotH.Start != h.Start || gotH.End != h.End || gotH.RequestID != h.RequestID {
				t.Fatalf("%s: frame header %+v (%d of %d bytes), sent %+v", c.Name(), gotH, used, len(frame), h)
			}
			if err := b.ImportKV(seq, l, start, got); err != nil {
				t.Fatalf("ImportKV(layer %d, at %d): %v", l, start, err)
			}
			raw += len(kv)
			wire += len(frame)
		}
	}
	return raw, wire
}

// TestEquivalenceDisaggregated is the oracle of disaggregated serving:
// prefill on engine A, KV through every lossless codec's frames, decode on
// engine B gives the tokens and logits of a single engine, bit for bit.
func TestEquivalenceDisaggregated(t *testing.T) {
	const steps = 12
	for _, preset := range equivalencePresets() {
		t.Run(preset, func(t *testing.T) {
			single := newEngine(t, preset, 0)
			reqs := workload(single)
			want := newTraces(reqs)
			prefillAll(t, single, reqs, want)
			decodeAll(t, single, reqs, want, steps)

			for _, c := range codec.LosslessCodecs() {
				t.Run(c.Name(), func(t *testing.T) {
					a, b := newEngine(t, preset, 1), newEngine(t, preset, 2)
					got := newTraces(reqs)
					// A prefills in two batches of a different mix.
					prefillAll(t, a, reqs[:2], got)
					prefillAll(t, a, reqs[2:], got)
					raw, wire := 0, 0
					for _, r := range reqs {
						rw, wr := transfer(t, a, b, r.seq, c, 16)
						raw, wire = raw+rw, wire+wr
						a.Free(r.seq)
					}
					t.Logf("%s: %d KV bytes → %d on the wire (%.2f×)", c.Name(), raw, wire, float64(raw)/float64(wire))
					// B decodes them in reverse order.
					rev := make([]request, len(reqs))
					for i, r := range reqs {
						rev[len(reqs)-1-i] = r
					}
					decodeAll(t, b, rev, got, steps)
					sameTraces(t, "disaggregated via "+c.Name(), want, got)
				})
			}
		})
	}
}

// TestEquivalenceChunkedPrefill checks that any chunking of a prompt, alone
// or mixed with other work in the same steps, yields the logits of one
// chunk bit for bit.
func TestEquivalenceChunkedPrefill(t *testing.T) {
	const steps = 6
	for _, preset := range equivalencePresets() {
		t.Run(preset, func(t *testing.T) {
			whole := newEngine(t, preset, 0)
			p := whole.Tokenizer().Encode("Chunked prefill splits a long prompt into pieces that share steps with decoding.")
			r := []request{{seq: 1, prompt: p}}
			want := newTraces(r)
			prefillAll(t, whole, r, want)
			decodeAll(t, whole, r, want, steps)

			other := whole.Tokenizer().Encode("a neighbour")
			for _, split := range [][]int{{1}, {16, 16, 16}, {7, 50}, {len(p) - 1}} {
				t.Run(fmt.Sprint(split), func(t *testing.T) {
					e := newEngine(t, preset, 0)
					ctx := context.Background()
					// A neighbour sequence decodes in the same steps.
					nb, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 9, Tokens: other, Last: true}}, nil)
					if err != nil {
						t.Fatal(err)
					}
					nbTok := nb[0].Token
					got := newTraces(r)
					start := 0
					for i := 0; start < len(p); i++ {
						end := len(p)
						if i < len(split) {
							end = min(start+split[i], len(p))
						}
						item := engine.PrefillItem{Seq: 1, Tokens: p[start:end], Last: end == len(p)}
						pOut, dOut, err := e.Step(ctx, []engine.PrefillItem{item}, []engine.DecodeItem{{Seq: 9, Token: nbTok}}, nil)
						if err != nil {
							t.Fatalf("Step chunk [%d, %d): %v", start, end, err)
						}
						nbTok = dOut[0].Token
						if item.Last {
							got[1].add(pOut[0])
						}
						start = end
					}
					decodeAll(t, e, r, got, steps)
					sameTraces(t, fmt.Sprintf("chunks %v", split), want, got)
				})
			}
		})
	}
}

// TestEquivalenceBatchedDecode checks that decoding sequences of different
// lengths together gives each the logits it gets alone, bit for bit, on any
// number of threads.
func TestEquivalenceBatchedDecode(t *testing.T) {
	const steps = 8
	for _, preset := range equivalencePresets() {
		t.Run(preset, func(t *testing.T) {
			alone := newEngine(t, preset, 1)
			reqs := workload(alone)
			want := newTraces(reqs)
			for _, r := range reqs {
				prefillAll(t, alone, []request{r}, want)
				decodeAll(t, alone, []request{r}, want, steps)
			}
			for _, threads := range []int{1, 3} {
				t.Run(fmt.Sprintf("threads %d", threads), func(t *testing.T) {
					e := newEngine(t, preset, threads)
					got := newTraces(reqs)
					prefillAll(t, e, reqs, got)
					decodeAll(t, e, reqs, got, steps)
					sameTraces(t, "batched decode", want, got)
				})
			}
		})
	}
}
