package enginetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/engine"
)

// NewFunc returns a fresh engine. Every engine it returns must hold the
// same model (same spec, same weights or profile), so that two of them fed
// the same inputs produce the same tokens; it registers the engine's
// cleanup with t.
type NewFunc func(t *testing.T) engine.Engine

// Option adjusts the suite to an engine.
type Option func(*config)

type config struct {
	logitTol float64         // see LogitTolerance
	only     map[string]bool // see Only; nil: every case
}

// LogitTolerance sets the largest absolute difference allowed between two
// logits the suite expects to be equal: the same sequence computed in
// different batch shapes, chunkings, or after a Fork. The default, 0,
// demands bit-identical logits (an engine whose results do not depend on
// the batch). Engines that compute no logits ignore it.
func LogitTolerance(tol float64) Option { return func(c *config) { c.logitTol = tol } }

// Only restricts the suite to the named cases (the subtest names of Run,
// such as "Fork" or "AllLogits"), to run some of them in another
// configuration of the engine.
func Only(names ...string) Option {
	return func(c *config) {
		c.only = map[string]bool{}
		for _, n := range names {
			c.only[n] = true
		}
	}
}

// Run runs the whole conformance suite as subtests of t. Any valid spec
// with MaxSeqLen ≥ 64 and Vocab ≥ 2 works; the engines are driven with
// short prompts (under 32 tokens) except where MaxSeqLen itself is tested,
// which imports MaxSeqLen-1 tokens of KV when that is at most 64 MiB and
// prefills them otherwise. An engine holds at most 8 sequences at once.
// Cases of optional features skip engines without them: Fork needs
// engine.Forker; AllLogits and Penalties compare logits and only check
// that an engine computing none (Output.Logits nil) returns none.
func Run(t *testing.T, newEngine NewFunc, opts ...Option) {
	t.Helper()
	cfg := &config{}
	for _, o := range opts {
		o(cfg)
	}
	tests := []struct {
		name string
		fn   func(*testing.T, NewFunc)
	}{
		{"Spec", testSpec},
		{"PrefillThenDecode", testPrefillThenDecode},
		{"EmptyBatch", testEmptyBatch},
		{"KVCallback", testKVCallback},
		{"KVCallbackError", testKVCallbackError},
		{"ChunkedPrefill", cfg.testChunkedPrefill},
		{"BatchedDecode", cfg.testBatchedDecode},
		{"ExportImport", testExportImport},
		{"ExportErrors", testExportErrors},
		{"ImportErrors", testImportErrors},
		{"IncompleteKV", testIncompleteKV},
		{"LenAndFree", testLenAndFree},
		{"BatchErrors", testBatchErrors},
		{"MaxSeqLen", testMaxSeqLen},
		{"Cancelled", testCancelled},
		{"RunStep", cfg.testRunStep},
		{"SeededSampling", cfg.testSeededSampling},
		{"Fork", cfg.testFork},
		{"ForkErrors", testForkErrors},
		{"AllLogits", cfg.testAllLogits},
		{"Penalties", cfg.testPenalties},
	}
	for _, tc := range tests {
		if cfg.only != nil && !cfg.only[tc.name] {
			continue
		}
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newEngine) })
	}
}

// prompt returns n deterministic token ids below the vocabulary size (and
// below 256, so byte-level tokenizers see ordinary bytes), varied by salt.
func prompt(spec engine.ModelSpec, n, salt int) []int32 {
	limit := min(spec.Vocab, 256)
	ids := make([]int32, n)
	x := uint32(salt)*2654435761 + 12345
	for i := range ids {
		x = x*1103515245 + 12345
		ids[i] = int32((x >> 16) % uint32(limit))
	}
	return ids
}

// checkOutputs verifies the shape of a batch's outputs: one per item, in
// order, with the item's seq, sampled exactly when wanted, a valid token
// and logits that are nil or of vocabulary length.
func checkOutputs(t *testing.T, spec engine.ModelSpec, outs []engine.Output, seqs []engine.SeqID, sampled []bool) {
	t.Helper()
	if len(outs) != len(seqs) {
		t.Fatalf("got %d outputs for %d items", len(outs), len(seqs))
	}
	for i, o := range outs {
		if o.Seq != seqs[i] {
			t.Fatalf("output %d is for seq %d, want %d (outputs in item order)", i, o.Seq, seqs[i])
		}
		if o.Sampled != sampled[i] {
			t.Fatalf("output %d (seq %d): Sampled = %v, want %v", i, o.Seq, o.Sampled, sampled[i])
		}
		if o.Sampled && (o.Token < 0 || int(o.Token) >= spec.Vocab) {
			t.Fatalf("output %d (seq %d): token %d outside [0, %d)", i, o.Seq, o.Token, spec.Vocab)
		}
		if o.Logits != nil && len(o.Logits) != spec.Vocab {
			t.Fatalf("output %d (seq %d): %d logits, want nil or %d", i, o.Seq, len(o.Logits), spec.Vocab)
		}
	}
}

// prefill runs one whole prompt as a single Last chunk and returns the
// first sampled token.
func prefill(t *testing.T, e engine.Engine, seq engine.SeqID, tokens []int32, s engine.Sampling) int32 {
	t.Helper()
	outs, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: seq, Tokens: tokens, Sampling: s, Last: true}}, nil)
	if err != nil {
		t.Fatalf("Prefill seq %d (%d tokens): %v", seq, len(tokens), err)
	}
	checkOutputs(t, e.Spec(), outs, []engine.SeqID{seq}, []bool{true})
	return outs[0].Token
}

// generate decodes n steps of one sequence alone, starting by appending
// first, and returns the n sampled tokens.
func generate(t *testing.T, e engine.Engine, seq engine.SeqID, first int32, n int, s engine.Sampling) []int32 {
	t.Helper()
	out := make([]int32, 0, n)
	tok := first
	for range n {
		outs, err := e.Decode(context.Background(), []engine.DecodeItem{{Seq: seq, Token: tok, Sampling: s}})
		if err != nil {
			t.Fatalf("Decode seq %d after %d steps: %v", seq, len(out), err)
		}
		checkOutputs(t, e.Spec(), outs, []engine.SeqID{seq}, []bool{true})
		tok = outs[0].Token
		out = append(out, tok)
	}
	return out
}

// prefillResult is prefill returning the first output's token and logits.
func prefillResult(t *testing.T, e engine.Engine, seq engine.SeqID, tokens []int32, s engine.Sampling) result {
	t.Helper()
	outs, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: seq, Tokens: tokens, Sampling: s, Last: true}}, nil)
	if err != nil {
		t.Fatalf("Prefill seq %d (%d tokens): %v", seq, len(tokens), err)
	}
	checkOutputs(t, e.Spec(), outs, []engine.SeqID{seq}, []bool{true})
	return resultOf(outs[0])
}

// greedyRun decodes n greedy steps of seq alone after first (what its
// prefill sampled), feeding each step the token drawn before, and returns
// first and the n outputs: a reference for checkResults.
func greedyRun(t *testing.T, e engine.Engine, seq engine.SeqID, first result, n int) []result {
	t.Helper()
	out := []result{first}
	for range n {
		out = append(out, decodeForced(t, e, seq, []int32{out[len(out)-1].tok}, engine.Sampling{})...)
	}
	return out
}

// tokensOf returns the tokens of rs.
func tokensOf(rs []result) []int32 {
	out := make([]int32, len(rs))
	for i, r := range rs {
		out[i] = r.tok
	}
	return out
}

// wantLen fails unless seq holds n tokens.
func wantLen(t *testing.T, e engine.Engine, seq engine.SeqID, n int) {
	t.Helper()
	got, err := e.Len(seq)
	if err != nil {
		t.Fatalf("Len(%d): %v", seq, err)
	}
	if got != n {
		t.Fatalf("Len(%d) = %d, want %d", seq, got, n)
	}
}

// wantErr fails unless err matches target.
func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: error %v, want one matching %q", what, err, target)
	}
}

// gone fails unless seq is unknown, or — the contract lets a failed first
// prefill leave a sequence that needs Free — holds no tokens; it frees
// seq either way.
func gone(t *testing.T, e engine.Engine, seq engine.SeqID) {
	t.Helper()
	n, err := e.Len(seq)
	switch {
	case errors.Is(err, engine.ErrUnknownSeq):
	case err != nil:
		t.Fatalf("Len(%d) after a failed first prefill: %v", seq, err)
	case n != 0:
		t.Fatalf("Len(%d) after a failed first prefill = %d, want 0 or ErrUnknownSeq", seq, n)
	}
	e.Free(seq)
}

func testSpec(t *testing.T, newEngine NewFunc) {
	e := newEngine(t)
	spec := e.Spec()
	if err := spec.Validate(); err != nil {
		t.Fatalf("Spec().Validate(): %v", err)
	}
	if spec.MaxSeqLen < 64 || spec.Vocab < 2 {
		t.Fatalf("the suite needs MaxSeqLen ≥ 64 and Vocab ≥ 2, spec has %d and %d", spec.MaxSeqLen, spec.Vocab)
	}
	tok := e.Tokenizer()
	if tok == nil {
		t.Fatal("Tokenizer() = nil")
	}
	if tok.Vocab() != spec.Vocab {
		t.Errorf("Tokenizer().Vocab() = %d, Spec().Vocab = %d", tok.Vocab(), spec.Vocab)
	}
	if spec.EOS >= 0 && tok.EOS() != spec.EOS {
		t.Errorf("Tokenizer().EOS() = %d, Spec().EOS = %d", tok.EOS(), spec.EOS)
	}
	if got := spec.KVChunkBytes(3); got != 3*spec.KVTokenBytes() {
		t.Errorf("KVChunkBytes(3) = %d, want %d", got, 3*spec.KVTokenBytes())
	}
}

func testPrefillThenDecode(t *testing.T, newEngine NewFunc) {
	e := newEngine(t)
	spec := e.Spec()
	ctx := context.Background()
	pa, pb := prompt(spec, 5, 1), prompt(spec, 9, 2)
	outs, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 10, Tokens: pa, Last: true}, {Seq: 20, Tokens: pb, Last: true}}, nil)
	if err != nil {
		t.Fatalf("Prefill: %v", err)
	}
	checkOutputs(t, spec, outs, []engine.SeqID{10, 20}, []bool{true, true})
	wantLen(t, e, 10, len(pa))
	wantLen(t, e, 20, len(pb))
	next := []int32{outs[0].Token, outs[1].Token}
	for step := 1; step <= 8; step++ {
		outs, err := e.Decode(ctx, []engine.DecodeItem{{Seq: 10, Token: next[0]}, {Seq: 20, Token: next[1]}})
		if err != nil {
			t.Fatalf("Decode step %d: %v", step, err)
		}
		checkOutputs(t, spec, outs, []engine.SeqID{10, 20}, []bool{true, true})
		next = []int32{outs[0].Token, outs[1].Token}
		wantLen(t, e, 10, len(pa)+step)
		wantLen(t, e, 20, len(pb)+step)
	}
}

func testEmptyBatch(t *testing.T, newEngine NewFunc) {
	e := newEngine(t)
	ctx := context.Background()
	if outs, err := e.Prefill(ctx, nil, nil); err != nil || len(outs) != 0 {
		t.Errorf("Prefill(empty) = %d outputs, %v; want none, nil", len(outs), err)
	}
	if outs, err := e.Decode(ctx, nil); err != nil || len(outs) != 0 {
		t.Errorf("Decode(empty) = %d outputs, %v; want none, nil", len(outs), err)
	}
	if p, d, err := engine.RunStep(ctx, e, nil, nil, nil); err != nil || len(p)+len(d) != 0 {
		t.Errorf("RunStep(empty) = %d+%d outputs, %v; want none, nil", len(p), len(d), err)
	}
}

// kvKey names one layer of one sequence.
type kvKey struct {
	seq   engine.SeqID
	layer int
}

// kvCopy is a copy of one chunk's data.
type kvCopy struct {
	start, end int
	data       []byte
}

// kvRecorder checks and records the chunks a prefill hands out.
type kvRecorder struct {
	t      *testing.T
	spec   engine.ModelSpec
	next   map[kvKey]int        // next expected start per layer
	layer  map[engine.SeqID]int // last layer seen per seq in this call
	data   map[kvKey][]kvCopy   // full-size chunks, copied
	chunks int
}

func newKVRecorder(t *testing.T, e engine.Engine) *kvRecorder {
	return &kvRecorder{t: t, spec: e.Spec(), next: map[kvKey]int{}, layer: map[engine.SeqID]int{}, data: map[kvKey][]kvCopy{}}
}

// startCall resets the per-call layer order check.
func (r *kvRecorder) startCall() { clear(r.layer) }

func (r *kvRecorder) onKV(c engine.KVChunk) error {
	t := r.t
	t.Helper()
	r.chunks++
	if c.Layer < 0 || c.Layer >= r.spec.Layers {
		t.Errorf("chunk of seq %d has layer %d outside [0, %d)", c.Seq, c.Layer, r.spec.Layers)
		return nil
	}
	if last, ok := r.layer[c.Seq]; ok && c.Layer < last {
		t.Errorf("seq %d: layer %d handed out after layer %d in the same call", c.Seq, c.Layer, last)
	}
	r.layer[c.Seq] = c.Layer
	k := kvKey{c.Seq, c.Layer}
	if c.Start != r.next[k] || c.End <= c.Start {
		t.Errorf("seq %d layer %d: chunk [%d, %d), want one starting at %d (each token exactly once, in order)", c.Seq, c.Layer, c.Start, c.End, r.next[k])
		return nil
	}
	r.next[k] = c.End
	want := r.spec.KVChunkBytes(c.End - c.Start)
	switch {
	case c.FullBytes != 0 && c.FullBytes != len(c.Data):
		// A scaled-down payload standing for the true size.
		if c.FullBytes != want || len(c.Data) > c.FullBytes {
			t.Errorf("seq %d layer %d [%d, %d): FullBytes %d, len(Data) %d; want FullBytes %d ≥ len(Data)", c.Seq, c.Layer, c.Start, c.End, c.FullBytes, len(c.Data), want)
		}
	case len(c.Data) != want:
		t.Errorf("seq %d layer %d [%d, %d): %d bytes of Data, want KVChunkBytes(%d) = %d", c.Seq, c.Layer, c.Start, c.End, len(c.Data), c.End-c.Start, want)
	default:
		if c.Bytes() != want {
			t.Errorf("seq %d layer %d: Bytes() = %d, want %d", c.Seq, c.Layer, c.Bytes(), want)
		}
		// Data is only valid during the call.
		r.data[k] = append(r.data[k], kvCopy{c.Start, c.End, bytes.Clone(c.Data)})
	}
	return nil
}

func testKVCallback(t *testing.T, newEngine NewFunc) {
	e := newEngine(t)
	spec := e.Spec()
	ctx := context.Background()
	rec := newKVRecorder(t, e)
	a, b, c := prompt(spec, 12, 3), prompt(spec, 4, 4), prompt(spec, 6, 5)

	// Call 1: a new seq's first chunk and a whole prompt.
	rec.startCall()
	outs, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: a[:7]}, {Seq: 2, Tokens: b, Last: true}}, rec.onKV)
	if err != nil {
		t.Fatalf("Prefill call 1: %v", err)
	}
	checkOutputs(t, spec, outs, []engine.SeqID{1, 2}, []bool{false, true})
	// Call 2: the rest of seq 1 next to a new seq.
	rec.startCall()
	outs, err = e.Prefill(ctx, []engine.PrefillItem{{Seq: 3, Tokens: c, Last: true}, {Seq: 1, Tokens: a[7:], Last: true}}, rec.onKV)
	if err != nil {
		t.Fatalf("Prefill call 2: %v", err)
	}
	checkOutputs(t, spec, outs, []engine.SeqID{3, 1}, []bool{true, true})
	// Decoding hands out nothing.
	before := rec.chunks
	if _, _, err := engine.RunStep(ctx, e, nil, []engine.DecodeItem{{Seq: 2, Token: outs[0].Token}}, rec.onKV); err != nil {
		t.Fatalf("RunStep decode: %v", err)
	}
	if rec.chunks != before {
		t.Errorf("a decode-only step handed out %d KV chunks, want 0", rec.chunks-before)
	}

	lens := map[engine.SeqID]int{1: len(a), 2: len(b), 3: len(c)}
	for seq, n := range lens {
		for l := range spec.Layers {
			k := kvKey{seq, l}
			if rec.next[k] != n {
				t.Errorf("seq %d layer %d: chunks covered [0, %d), want [0, %d)", seq, l, rec.next[k], n)
				continue
			}
			for _, c := range rec.data[k] { // scaled-down payloads are not compared
				exp, err := e.ExportKV(seq, l, c.start, c.end, nil)
				if err != nil {
					t.Fatalf("ExportKV(seq %d, layer %d, %d, %d): %v", seq, l, c.start, c.end, err)
				}
				if !bytes.Equal(c.data, exp) {
					t.Errorf("seq %d layer %d [%d, %d): KV handed out during prefill differs from ExportKV", seq, l, c.start, c.end)
				}
			}
		}
	}
}

var errBoom = errors.New("enginetest: callback refused the chunk")

func testKVCallbackError(t *testing.T, newEngine NewFunc) {
	e, ref := newEngine(t), newEngine(t)
	spec := e.Spec()
	ctx := context.Background()
	p := prompt(spec, 10, 6)
	tail := prompt(spec, 5, 7)
	fresh := prompt(spec, 8, 8)
	for _, en := range []engine.Engine{e, ref} {
		if _, err := en.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p}}, nil); err != nil {
			t.Fatalf("Prefill: %v", err)
		}
	}
	calls := 0
	refuse := func(engine.KVChunk) error {
		if calls++; calls == 2 {
			return errBoom
		}
		return nil
	}
	_, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: tail, Last: true}, {Seq: 2, Tokens: fresh, Last: true}}, refuse)
	wantErr(t, "Prefill with a failing callback", err, errBoom)
	wantLen(t, e, 1, len(p))
	gone(t, e, 2)

	// The failed call left no trace: the same work again gives what an
	// engine that never failed gives.
	want := prefill(t, ref, 1, tail, engine.Sampling{})
	if got := prefill(t, e, 1, tail, engine.Sampling{}); got != want {
		t.Errorf("after a failed prefill, seq 1's next token = %d, want %d", got, want)
	}
	if diff := cmp.Diff(generate(t, ref, 1, want, 6, engine.Sampling{}), generate(t, e, 1, want, 6, engine.Sampling{})); diff != "" {
		t.Errorf("after a failed prefill, decoded tokens differ (-want +got):\n%s", diff)
	}
	if got, want := prefill(t, e, 2, fresh, engine.Sampling{}), prefill(t, ref, 2, fresh, engine.Sampling{}); got != want {
		t.Errorf("seq 2 prefilled after its failed first prefill: token %d, want %d", got, want)
	}
}

// testChunkedPrefill: a prompt prefilled in chunks decodes as if
// prefilled whole. The chunks are other llama_decode shapes, so the runs
// are compared by checkResults (teacher-forced, logits within the
// tolerance).
func (c *config) testChunkedPrefill(t *testing.T, newEngine NewFunc) {
	ctx := context.Background()
	whole := newEngine(t)
	spec := whole.Spec()
	p := prompt(spec, 23, 9)
	s := engine.Sampling{}
	want := greedyRun(t, whole, 1, prefillResult(t, whole, 1, p, s), 6)
	fed := tokensOf(want[:len(want)-1])

	splits := [][]int{{1}, {11}, {22}, {3, 3, 3, 3}, {5, 1, 9}}
	for _, split := range splits {
		t.Run(fmt.Sprint(split), func(t *testing.T) {
			e := newEngine(t)
			start := 0
			for _, n := range split {
				outs, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p[start : start+n]}}, nil)
				if err != nil {
					t.Fatalf("Prefill chunk [%d, %d): %v", start, start+n, err)
				}
				checkOutputs(t, spec, outs, []engine.SeqID{1}, []bool{false})
				start += n
				wantLen(t, e, 1, start)
			}
			got := append([]result{prefillResult(t, e, 1, p[start:], s)}, decodeForced(t, e, 1, fed, s)...)
			c.checkResults(t, fmt.Sprintf("chunked prefill %v", split), want, got)
		})
	}

	// The last prompt token appended by Decode instead of a Last chunk.
	t.Run("decode last token", func(t *testing.T) {
		e := newEngine(t)
		if _, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p[:len(p)-1]}}, nil); err != nil {
			t.Fatalf("Prefill: %v", err)
		}
		c.checkResults(t, "last prompt token decoded", want, decodeForced(t, e, 1, append([]int32{p[len(p)-1]}, fed...), s))
	})

	// Chunks of two sequences interleaved in the same batches.
	t.Run("two sequences", func(t *testing.T) {
		q := prompt(spec, 9, 10)
		qFirst := prefillResult(t, whole, 2, q, s)
		e := newEngine(t)
		if _, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p[:10]}, {Seq: 2, Tokens: q[:4]}}, nil); err != nil {
			t.Fatalf("Prefill call 1: %v", err)
		}
		outs, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 2, Tokens: q[4:], Last: true}, {Seq: 1, Tokens: p[10:], Last: true}}, nil)
		if err != nil {
			t.Fatalf("Prefill call 2: %v", err)
		}
		checkOutputs(t, spec, outs, []engine.SeqID{2, 1}, []bool{true, true})
		c.checkResults(t, "first tokens (seq 2, seq 1)", []result{qFirst, want[0]}, []result{resultOf(outs[0]), resultOf(outs[1])})
	})
}

// testBatchedDecode: sequences decoded together in changing batches
// produce what each produces alone (compared by checkResults: the batch
// is another llama_decode shape).
func (c *config) testBatchedDecode(t *testing.T, newEngine NewFunc) {
	ctx := context.Background()
	const steps = 10
	alone := newEngine(t)
	spec := alone.Spec()
	lens := []int{3, 8, 13, 21}
	prompts := make([][]int32, len(lens))
	want := make([][]result, len(lens))
	for i, n := range lens {
		prompts[i] = prompt(spec, n, 20+i)
		seq := engine.SeqID(100 + i)
		want[i] = greedyRun(t, alone, seq, prefillResult(t, alone, seq, prompts[i], engine.Sampling{}), steps)
	}

	e := newEngine(t)
	items := make([]engine.PrefillItem, len(lens))
	for i := range lens {
		items[i] = engine.PrefillItem{Seq: engine.SeqID(i), Tokens: prompts[i], Last: true}
	}
	outs, err := e.Prefill(ctx, items, nil)
	if err != nil {
		t.Fatalf("batched Prefill: %v", err)
	}
	got := make([][]result, len(lens))
	for i, o := range outs {
		got[i] = []result{resultOf(o)}
	}
	// fed is the token seq i is fed next: the alone run's (teacher forcing).
	fed := func(i int) int32 { return want[i][len(got[i])-1].tok }
	for step := range steps {
		// Vary membership and order: seq 2 sits out step 3 (and catches
		// up alone), the order rotates every step.
		var batch []engine.DecodeItem
		for j := range lens {
			i := (j + step) % len(lens)
			if i == 2 && step == 3 {
				continue
			}
			batch = append(batch, engine.DecodeItem{Seq: engine.SeqID(i), Token: fed(i)})
		}
		outs, err := e.Decode(ctx, batch)
		if err != nil {
			t.Fatalf("batched Decode step %d: %v", step, err)
		}
		for k, o := range outs {
			if o.Seq != batch[k].Seq {
				t.Fatalf("step %d: output %d for seq %d, want %d", step, k, o.Seq, batch[k].Seq)
			}
			got[o.Seq] = append(got[o.Seq], resultOf(o))
		}
		if step == 3 {
			got[2] = append(got[2], decodeForced(t, e, 2, []int32{fed(2)}, engine.Sampling{})...)
		}
	}
	for i := range lens {
		c.checkResults(t, fmt.Sprintf("seq %d batched against alone", i), want[i], got[i])
		wantLen(t, e, engine.SeqID(i), lens[i]+steps)
	}
}

func testExportImport(t *testing.T, newEngine NewFunc) {
	a, b := newEngine(t), newEngine(t)
	spec := a.Spec()
	p := prompt(spec, 17, 30)
	s := engine.Sampling{Temperature: 0.8, TopP: 0.9, Seed: 99}
	first := prefill(t, a, 1, p, s)

	const split = 10
	for l := range spec.Layers {
		for _, r := range [][2]int{{0, split}, {split, len(p)}} {
			prefix := []byte("keep")
			data, err := a.ExportKV(1, l, r[0], r[1], prefix)
			if err != nil {
				t.Fatalf("ExportKV(layer %d, [%d, %d)): %v", l, r[0], r[1], err)
			}
			if !bytes.HasPrefix(data, []byte("keep")) {
				t.Fatalf("ExportKV did not append to dst")
			}
			data = data[len("keep"):]
			if len(data) != spec.KVChunkBytes(r[1]-r[0]) {
				t.Fatalf("ExportKV(layer %d, [%d, %d)) = %d bytes, want %d", l, r[0], r[1], len(data), spec.KVChunkBytes(r[1]-r[0]))
			}
			if err := b.ImportKV(7, l, r[0], data); err != nil {
				t.Fatalf("ImportKV(layer %d, at %d): %v", l, r[0], err)
			}
		}
	}
	wantLen(t, b, 7, len(p))
	for l := range spec.Layers {
		ea, err := a.ExportKV(1, l, 0, len(p), nil)
		if err != nil {
			t.Fatal(err)
		}
		eb, err := b.ExportKV(7, l, 0, len(p), nil)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(ea, eb) {
			t.Fatalf("layer %d: KV exported after import differs from the original", l)
		}
	}
	want := generate(t, a, 1, first, 8, s)
	got := generate(t, b, 7, first, 8, s)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("decode after import differs from the exporting engine (-want +got):\n%s", diff)
	}
}

func testExportErrors(t *testing.T, newEngine NewFunc) {
	e := newEngine(t)
	spec := e.Spec()
	prefill(t, e, 1, prompt(spec, 6, 31), engine.Sampling{})
	_, err := e.ExportKV(2, 0, 0, 1, nil)
	wantErr(t, "ExportKV of an unknown seq", err, engine.ErrUnknownSeq)
	for _, r := range []struct{ layer, start, end int }{
		{-1, 0, 1}, {spec.Layers, 0, 1}, {0, -1, 2}, {0, 4, 3}, {0, 0, 7}, {spec.Layers - 1, 6, 7},
	} {
		_, err := e.ExportKV(1, r.layer, r.start, r.end, nil)
		wantErr(t, fmt.Sprintf("ExportKV(layer %d, [%d, %d)) of 6 tokens", r.layer, r.start, r.end), err, engine.ErrRange)
	}
	if data, err := e.ExportKV(1, 0, 2, 2, nil); err != nil || len(data) != 0 {
		t.Errorf("ExportKV of an empty range = %d bytes, %v; want 0, nil", len(data), err)
	}
}

func testImportErrors(t *testing.T, newEngine NewFunc) {
	e := newEngine(t)
	spec := e.Spec()
	tok := spec.KVTokenBytes()
	err := e.ImportKV(1, 0, 1, make([]byte, tok))
	wantErr(t, "ImportKV at token 1 of an empty layer", err, engine.ErrRange)
	err = e.ImportKV(1, 0, 0, make([]byte, tok+1))
	wantErr(t, "ImportKV of a partial token", err, engine.ErrRange)
	err = e.ImportKV(1, spec.Layers, 0, make([]byte, tok))
	wantErr(t, "ImportKV of a layer past the last", err, engine.ErrRange)
	if err := e.ImportKV(1, 0, 0, make([]byte, 2*tok)); err != nil {
		t.Fatalf("ImportKV of 2 tokens: %v", err)
	}
	err = e.ImportKV(1, 0, 1, make([]byte, tok))
	wantErr(t, "ImportKV overlapping held tokens", err, engine.ErrRange)
	err = e.ImportKV(1, 0, 3, make([]byte, tok))
	wantErr(t, "ImportKV leaving a gap", err, engine.ErrRange)
	if big := spec.KVChunkBytes(spec.MaxSeqLen - 1); big <= 64<<20 {
		err = e.ImportKV(1, 0, 2, make([]byte, big))
		wantErr(t, "ImportKV past MaxSeqLen", err, engine.ErrSeqTooLong)
	} else {
		t.Logf("ImportKV past MaxSeqLen not checked: %d bytes is too large for a test", big)
	}
	if err := e.ImportKV(1, 0, 2, make([]byte, tok)); err != nil {
		t.Errorf("ImportKV after refused imports: %v", err)
	}
}

func testIncompleteKV(t *testing.T, newEngine NewFunc) {
	a, b := newEngine(t), newEngine(t)
	spec := a.Spec()
	if spec.Layers < 2 {
		t.Skip("needs at least 2 layers")
	}
	p := prompt(spec, 5, 32)
	first := prefill(t, a, 1, p, engine.Sampling{})
	for l := range spec.Layers - 1 {
		data, err := a.ExportKV(1, l, 0, len(p), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.ImportKV(1, l, 0, data); err != nil {
			t.Fatalf("ImportKV layer %d: %v", l, err)
		}
	}
	_, err := b.Decode(context.Background(), []engine.DecodeItem{{Seq: 1, Token: first}})
	wantErr(t, "Decode with the last layer missing", err, engine.ErrIncompleteKV)
	last := spec.Layers - 1
	data, err := a.ExportKV(1, last, 0, len(p), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.ImportKV(1, last, 0, data); err != nil {
		t.Fatalf("ImportKV last layer: %v", err)
	}
	if diff := cmp.Diff(generate(t, a, 1, first, 4, engine.Sampling{}), generate(t, b, 1, first, 4, engine.Sampling{})); diff != "" {
		t.Errorf("decode once complete differs (-want +got):\n%s", diff)
	}
}

func testLenAndFree(t *testing.T, newEngine NewFunc) {
	e := newEngine(t)
	spec := e.Spec()
	ctx := context.Background()
	_, err := e.Len(1)
	wantErr(t, "Len of an unknown seq", err, engine.ErrUnknownSeq)
	e.Free(1) // unknown: no-op

	p := prompt(spec, 7, 33)
	first := prefill(t, e, 1, p, engine.Sampling{})
	prefill(t, e, 2, prompt(spec, 4, 34), engine.Sampling{})
	toks := generate(t, e, 1, first, 3, engine.Sampling{})
	wantLen(t, e, 1, len(p)+3)

	e.Free(1)
	_, err = e.Len(1)
	wantErr(t, "Len after Free", err, engine.ErrUnknownSeq)
	_, err = e.Decode(ctx, []engine.DecodeItem{{Seq: 1, Token: toks[2]}})
	wantErr(t, "Decode after Free", err, engine.ErrUnknownSeq)
	_, err = e.ExportKV(1, 0, 0, 1, nil)
	wantErr(t, "ExportKV after Free", err, engine.ErrUnknownSeq)
	wantLen(t, e, 2, 4) // other sequences untouched
	e.Free(1)           // twice: no-op

	// The id is free for a new sequence that starts from scratch.
	if got := prefill(t, e, 1, p, engine.Sampling{}); got != first {
		t.Errorf("re-used seq id: first token %d, want %d", got, first)
	}
	if diff := cmp.Diff(toks, generate(t, e, 1, first, 3, engine.Sampling{})); diff != "" {
		t.Errorf("re-used seq id: tokens differ (-want +got):\n%s", diff)
	}
}

func testBatchErrors(t *testing.T, newEngine NewFunc) {
	ctx := context.Background()
	setup := func(t *testing.T) (engine.Engine, int32) {
		e := newEngine(t)
		first := prefill(t, e, 1, prompt(e.Spec(), 5, 35), engine.Sampling{})
		return e, first
	}
	e0 := newEngine(t)
	spec := e0.Spec()
	ok := prompt(spec, 3, 36)
	bad := int32(spec.Vocab)
	tests := []struct {
		name    string
		prefill []engine.PrefillItem
		decode  func(first int32) []engine.DecodeItem
		want    error
	}{
		{"prefill duplicate seq", []engine.PrefillItem{{Seq: 2, Tokens: ok}, {Seq: 2, Tokens: ok, Last: true}}, nil, engine.ErrDuplicateSeq},
		{"prefill duplicate existing seq", []engine.PrefillItem{{Seq: 1, Tokens: ok}, {Seq: 1, Tokens: ok}}, nil, engine.ErrDuplicateSeq},
		{"prefill token = vocab", []engine.PrefillItem{{Seq: 1, Tokens: ok}, {Seq: 2, Tokens: []int32{1, bad}, Last: true}}, nil, engine.ErrBadToken},
		{"prefill negative token", []engine.PrefillItem{{Seq: 2, Tokens: []int32{-1}, Last: true}, {Seq: 1, Tokens: ok}}, nil, engine.ErrBadToken},
		{"prefill too long", []engine.PrefillItem{{Seq: 1, Tokens: ok}, {Seq: 2, Tokens: make([]int32, spec.MaxSeqLen+1), Last: true}}, nil, engine.ErrSeqTooLong},
		{"prefill continuation too long", []engine.PrefillItem{{Seq: 1, Tokens: make([]int32, spec.MaxSeqLen-4), Last: true}}, nil, engine.ErrSeqTooLong},
		{"decode unknown seq", nil, func(f int32) []engine.DecodeItem { return []engine.DecodeItem{{Seq: 1, Token: f}, {Seq: 9, Token: f}} }, engine.ErrUnknownSeq},
		{"decode duplicate seq", nil, func(f int32) []engine.DecodeItem { return []engine.DecodeItem{{Seq: 1, Token: f}, {Seq: 1, Token: f}} }, engine.ErrDuplicateSeq},
		{"decode bad token", nil, func(f int32) []engine.DecodeItem { return []engine.DecodeItem{{Seq: 1, Token: bad}} }, engine.ErrBadToken},
		{"decode negative token", nil, func(f int32) []engine.DecodeItem { return []engine.DecodeItem{{Seq: 1, Token: -3}} }, engine.ErrBadToken},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, first := setup(t)
			var err error
			if tc.decode != nil {
				_, err = e.Decode(ctx, tc.decode(first))
			} else {
				_, err = e.Prefill(ctx, tc.prefill, nil)
			}
			wantErr(t, tc.name, err, tc.want)
			// Nothing advanced: seq 1 continues as if the call never happened.
			wantLen(t, e, 1, 5)
			gone(t, e, 2)
			ref, refFirst := setup(t)
			if diff := cmp.Diff(generate(t, ref, 1, refFirst, 3, engine.Sampling{}), generate(t, e, 1, first, 3, engine.Sampling{})); diff != "" {
				t.Errorf("after the failed call seq 1 decodes differently (-want +got):\n%s", diff)
			}
		})
	}
}

func testMaxSeqLen(t *testing.T, newEngine NewFunc) {
	e := newEngine(t)
	spec := e.Spec()
	ctx := context.Background()
	n := spec.MaxSeqLen - 1
	var next int32
	if spec.KVChunkBytes(n)*spec.Layers <= 64<<20 {
		// Fill the sequence cheaply: import n tokens of KV from a
		// shorter prefill repeated (contents do not matter here).
		src := newEngine(t)
		p := prompt(spec, 16, 37)
		next = prefill(t, src, 1, p, engine.Sampling{})
		for l := range spec.Layers {
			chunk, err := src.ExportKV(1, l, 0, len(p), nil)
			if err != nil {
				t.Fatal(err)
			}
			for start := 0; start < n; start += len(p) {
				m := min(len(p), n-start)
				if err := e.ImportKV(1, l, start, chunk[:spec.KVChunkBytes(m)]); err != nil {
					t.Fatalf("ImportKV layer %d at %d: %v", l, start, err)
				}
			}
		}
	} else {
		next = prefill(t, e, 1, prompt(spec, n, 37), engine.Sampling{})
	}
	wantLen(t, e, 1, n)
	outs, err := e.Decode(ctx, []engine.DecodeItem{{Seq: 1, Token: next}})
	if err != nil {
		t.Fatalf("Decode to MaxSeqLen: %v", err)
	}
	wantLen(t, e, 1, spec.MaxSeqLen)
	_, err = e.Decode(ctx, []engine.DecodeItem{{Seq: 1, Token: outs[0].Token}})
	wantErr(t, "Decode past MaxSeqLen", err, engine.ErrSeqTooLong)
	_, err = e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: []int32{0}, Last: true}}, nil)
	wantErr(t, "Prefill past MaxSeqLen", err, engine.ErrSeqTooLong)
	wantLen(t, e, 1, spec.MaxSeqLen)
}

func testCancelled(t *testing.T, newEngine NewFunc) {
	e := newEngine(t)
	spec := e.Spec()
	p := prompt(spec, 9, 38)
	first := prefill(t, e, 1, p, engine.Sampling{})

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p[:2]}, {Seq: 2, Tokens: p, Last: true}}, nil)
	wantErr(t, "Prefill with a cancelled ctx", err, context.Canceled)
	_, err = e.Decode(ctx, []engine.DecodeItem{{Seq: 1, Token: first}})
	wantErr(t, "Decode with a cancelled ctx", err, context.Canceled)
	_, _, err = engine.RunStep(ctx, e, []engine.PrefillItem{{Seq: 2, Tokens: p}}, []engine.DecodeItem{{Seq: 1, Token: first}}, nil)
	wantErr(t, "RunStep with a cancelled ctx", err, context.Canceled)
	expired, cancel2 := context.WithTimeout(context.Background(), 0)
	defer cancel2()
	_, err = e.Decode(expired, []engine.DecodeItem{{Seq: 1, Token: first}})
	wantErr(t, "Decode with an expired ctx", err, context.DeadlineExceeded)
	wantLen(t, e, 1, len(p))
	gone(t, e, 2)

	// Cancelled while running (from the KV callback): either the call
	// finishes or it fails with the ctx error and changes nothing.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	_, err = e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p[:3], Last: true}}, func(engine.KVChunk) error {
		cancel()
		return nil
	})
	switch {
	case err == nil:
		wantLen(t, e, 1, len(p)+3)
	case errors.Is(err, context.Canceled):
		wantLen(t, e, 1, len(p))
	default:
		t.Fatalf("Prefill cancelled from its callback: %v, want nil or context.Canceled", err)
	}
}

func (c *config) testRunStep(t *testing.T, newEngine NewFunc) {
	ctx := context.Background()
	a, b := newEngine(t), newEngine(t)
	spec := a.Spec()
	p1, p2, p3 := prompt(spec, 6, 40), prompt(spec, 11, 41), prompt(spec, 8, 42)
	s := engine.Sampling{}

	// Engine b: separate calls. Engine a: one RunStep with everything.
	f1 := prefill(t, b, 1, p1, s)
	if _, err := b.Prefill(ctx, []engine.PrefillItem{{Seq: 3, Tokens: p3[:5]}}, nil); err != nil {
		t.Fatal(err)
	}
	outs, err := b.Prefill(ctx, []engine.PrefillItem{{Seq: 2, Tokens: p2, Last: true}, {Seq: 3, Tokens: p3[5:], Last: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []result{resultOf(outs[0]), resultOf(outs[1]), decodeForced(t, b, 1, []int32{f1}, s)[0]}

	if got := prefill(t, a, 1, p1, s); got != f1 {
		t.Fatalf("first token %d, want %d", got, f1)
	}
	if _, err := a.Prefill(ctx, []engine.PrefillItem{{Seq: 3, Tokens: p3[:5]}}, nil); err != nil {
		t.Fatal(err)
	}
	rec := newKVRecorder(t, a)
	rec.next[kvKey{3, 0}] = 5
	for l := 1; l < spec.Layers; l++ {
		rec.next[kvKey{3, l}] = 5
	}
	pOut, dOut, err := engine.RunStep(ctx, a,
		[]engine.PrefillItem{{Seq: 2, Tokens: p2, Last: true}, {Seq: 3, Tokens: p3[5:], Last: true}},
		[]engine.DecodeItem{{Seq: 1, Token: f1}}, rec.onKV)
	if err != nil {
		t.Fatalf("RunStep: %v", err)
	}
	checkOutputs(t, spec, pOut, []engine.SeqID{2, 3}, []bool{true, true})
	checkOutputs(t, spec, dOut, []engine.SeqID{1}, []bool{true})
	// One step of several shapes at once against separate calls.
	c.checkResults(t, "RunStep against separate Prefill and Decode", want, []result{resultOf(pOut[0]), resultOf(pOut[1]), resultOf(dOut[0])})
	for l := range spec.Layers {
		if rec.next[kvKey{2, l}] != len(p2) || rec.next[kvKey{3, l}] != len(p3) {
			t.Errorf("layer %d: RunStep handed out KV up to (%d, %d), want (%d, %d)", l, rec.next[kvKey{2, l}], rec.next[kvKey{3, l}], len(p2), len(p3))
		}
	}
	wantLen(t, a, 1, len(p1)+1)
	wantLen(t, a, 2, len(p2))
	wantLen(t, a, 3, len(p3))

	if st, ok := a.(engine.Stepper); ok {
		_, _, err := st.Step(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p1[:1]}}, []engine.DecodeItem{{Seq: 1, Token: dOut[0].Token}}, nil)
		wantErr(t, "Step with one seq in both lists", err, engine.ErrDuplicateSeq)
		wantLen(t, a, 1, len(p1)+1)
	}
}

// testSeededSampling: a sampled token depends only on the sequence's own
// logits, seed and position, never on the other sequences of the batch.
//
// What is asserted, and why: on a fresh engine the same seed draws the
// same tokens (the computation is the same, so exactly). In a crowded
// batch the computation differs: an engine whose logits depend on the
// batch (llama.cpp's CPU kernels do, within the tolerance) may then draw
// another token wherever the draw falls near the boundary between two
// tokens, which at temperature 1 over a large vocabulary is almost
// anywhere. So the crowded run is fed the alone run's tokens (teacher
// forcing), its logits must match the alone run's within the tolerance,
// and each token it draws must be exactly engine.Sample of its own logits
// with its own seed and position: a sampler that took another sequence's
// seed, its batch index or a shared random stream fails that. With
// tolerance 0 the tokens must also equal the alone run's.
func (c *config) testSeededSampling(t *testing.T, newEngine NewFunc) {
	ctx := context.Background()
	const steps = 16
	p := prompt(newEngine(t).Spec(), 10, 50)
	// run samples seq 1 with seed; forced, when not nil, gives the tokens
	// fed after each step instead of the drawn ones.
	run := func(t *testing.T, seed uint64, crowd bool, forced []int32) []result {
		t.Helper()
		e := newEngine(t)
		s := engine.Sampling{Temperature: 1, TopP: 0.95, Seed: seed}
		items := []engine.PrefillItem{{Seq: 1, Tokens: p, Sampling: s, Last: true}}
		crowdS := map[engine.SeqID]engine.Sampling{5: {Temperature: 1, Seed: seed + 1}, 6: {Temperature: 0.5, Seed: 7}}
		if crowd {
			// Other sequences, other seeds, different positions.
			items = append([]engine.PrefillItem{{Seq: 5, Tokens: p[:4], Sampling: crowdS[5], Last: true}}, items...)
			items = append(items, engine.PrefillItem{Seq: 6, Tokens: p, Sampling: crowdS[6], Last: true})
		}
		outs, err := e.Prefill(ctx, items, nil)
		if err != nil {
			t.Fatalf("Prefill: %v", err)
		}
		var got []result
		next := map[engine.SeqID]int32{}
		pos := len(p)
		check := func(o engine.Output, s engine.Sampling, pos int) {
			if o.Logits != nil {
				if want := engine.Sample(o.Logits, s, pos, nil); o.Token != want {
					t.Errorf("seq %d at position %d drew token %d, want %d (engine.Sample of its own logits, seed %d)", o.Seq, pos, o.Token, want, s.Seed)
				}
			}
		}
		for i, o := range outs {
			next[o.Seq] = o.Token
			if o.Seq == 1 {
				got = append(got, resultOf(o))
				check(o, s, pos)
			} else {
				check(o, crowdS[o.Seq], len(items[i].Tokens))
			}
		}
		for step := range steps {
			in := next[1]
			if forced != nil {
				in = forced[step]
			}
			batch := []engine.DecodeItem{{Seq: 1, Token: in, Sampling: s}}
			if crowd {
				batch = append(batch, engine.DecodeItem{Seq: 6, Token: next[6], Sampling: crowdS[6]})
			}
			outs, err := e.Decode(ctx, batch)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			pos++
			for _, o := range outs {
				next[o.Seq] = o.Token
				if o.Seq == 1 {
					got = append(got, resultOf(o))
					check(o, s, pos)
				} else {
					check(o, crowdS[6], pos)
				}
			}
		}
		return got
	}
	alone := run(t, 1234, false, nil)
	want := tokensOf(alone)
	if diff := cmp.Diff(want, tokensOf(run(t, 1234, false, nil))); diff != "" {
		t.Errorf("same seed on a fresh engine: tokens differ (-want +got):\n%s", diff)
	}
	crowded := run(t, 1234, true, want)
	for i := range alone {
		c.checkLogits(t, fmt.Sprintf("same seed in a crowded batch, step %d", i), alone[i].logits, crowded[i].logits)
		if crowded[i].tok != alone[i].tok && len(crowded[i].logits) == len(alone[i].logits) {
			d, _ := maxDiff(alone[i].logits, crowded[i].logits)
			t.Logf("crowded batch, step %d: drew token %d where alone drew %d, its logits within %.3g of the alone run's (a draw near the boundary of two tokens)", i, crowded[i].tok, alone[i].tok, d)
		}
	}
	if c.logitTol == 0 || alone[0].logits == nil {
		if diff := cmp.Diff(want, tokensOf(crowded)); diff != "" {
			t.Errorf("same seed in a crowded batch: tokens differ (-want +got):\n%s", diff)
		}
	}
	differ := false
	for _, seed := range []uint64{1, 2, 3, 4} {
		if !cmp.Equal(want, tokensOf(run(t, seed, false, nil))) {
			differ = true
			break
		}
	}
	if !differ {
		t.Errorf("seeds 1–4 and 1234 all sample the same %d tokens at temperature 1: the seed is ignored", steps+1)
	}
}
