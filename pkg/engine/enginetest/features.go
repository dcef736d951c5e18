package enginetest

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/engine"
)

// Cases of the optional parts of the contract: engine.Forker,
// PrefillItem.AllLogits and Sampling.Penalties.

// result is one sampled output: its token and a copy of its logits (nil
// when the engine computes none).
type result struct {
	tok    int32
	logits []float32
}

func resultOf(o engine.Output) result {
	return result{tok: o.Token, logits: slices.Clone(o.Logits)}
}

// checkLogits fails unless got and want agree within the tolerance: the
// same length and every pair of values equal (infinities included) or
// within logitTol of each other.
func (c *config) checkLogits(t *testing.T, what string, want, got []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d logits, want %d", what, len(got), len(want))
		return
	}
	worst, at := maxDiff(want, got)
	if at >= 0 && !(worst <= c.logitTol) {
		t.Errorf("%s: logit %d is %v, want %v (|Δ| = %g > tolerance %g)", what, at, got[at], want[at], worst, c.logitTol)
	}
}

// maxDiff returns the largest |a[i] − b[i]| of two logit vectors of one
// length and its index (-1 when they are identical; NaN counts as the
// largest).
func maxDiff(a, b []float32) (worst float64, at int) {
	at = -1
	for i := range a {
		if a[i] == b[i] {
			continue
		}
		d := math.Abs(float64(a[i]) - float64(b[i]))
		if !(d <= worst) {
			worst, at = d, i
		}
	}
	return worst, at
}

// checkResults compares two runs' greedy outputs step by step, both runs
// fed the same tokens (teacher forcing, so that one flipped token does not
// change what every later step computes): logits within the tolerance and
// the same token, except where the reference's logits leave the choice
// open within the tolerance (see checkGreedy).
func (c *config) checkResults(t *testing.T, what string, want, got []result) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d outputs, want %d", what, len(got), len(want))
	}
	for i := range want {
		step := fmt.Sprintf("%s, step %d", what, i)
		if (got[i].logits == nil) != (want[i].logits == nil) {
			t.Errorf("%s: logits present %v, in the reference %v", step, got[i].logits != nil, want[i].logits != nil)
			continue
		}
		c.checkLogits(t, step, want[i].logits, got[i].logits)
		c.checkGreedy(t, step, want[i], got[i])
	}
}

// checkGreedy fails unless got's greedy token is want's, or a token that
// the tolerance allows: what llama.cpp guarantees for one sequence in two
// batch shapes or cache layouts is logits within the tolerance, not
// identical ones, so where want's best logit leads another token's by no
// more than 2·tolerance (each may move by the tolerance), either may be
// chosen. With tolerance 0 (an engine whose results do not depend on the
// batch), or without logits, the tokens must be equal.
func (c *config) checkGreedy(t *testing.T, what string, want, got result) {
	t.Helper()
	if got.tok == want.tok {
		return
	}
	if c.logitTol > 0 && want.logits != nil && int(got.tok) < len(want.logits) && int(want.tok) < len(want.logits) {
		lead := float64(want.logits[want.tok]) - float64(want.logits[got.tok])
		if lead <= 2*c.logitTol {
			gl := "no logits"
			if got.logits != nil {
				gl = fmt.Sprintf("here %v and %v", got.logits[want.tok], got.logits[got.tok])
			}
			t.Logf("%s: token %d, reference %d: a near tie (the reference's logits %v and %v, %.3g apart, within 2×tolerance %g; %s)",
				what, got.tok, want.tok, want.logits[want.tok], want.logits[got.tok], lead, c.logitTol, gl)
			return
		}
		t.Errorf("%s: token %d, want %d (the reference's logit of %d leads that of %d by %.3g, more than 2×tolerance %g)",
			what, got.tok, want.tok, want.tok, got.tok, lead, c.logitTol)
		return
	}
	t.Errorf("%s: token %d, want %d", what, got.tok, want.tok)
}

// decodeForced decodes seq alone once per token of toks (teacher forcing:
// the tokens appended are toks, whatever is sampled) and returns what
// each step produced.
func decodeForced(t *testing.T, e engine.Engine, seq engine.SeqID, toks []int32, s engine.Sampling) []result {
	t.Helper()
	out := make([]result, 0, len(toks))
	for i, tok := range toks {
		outs, err := e.Decode(context.Background(), []engine.DecodeItem{{Seq: seq, Token: tok, Sampling: s}})
		if err != nil {
			t.Fatalf("Decode seq %d step %d: %v", seq, i, err)
		}
		checkOutputs(t, e.Spec(), outs, []engine.SeqID{seq}, []bool{true})
		out = append(out, resultOf(outs[0]))
	}
	return out
}

// reference returns, from a fresh engine, what a sequence prefilled with
// prefix (no token sampled) and then decoded with toks produces.
func reference(t *testing.T, newEngine NewFunc, prefix, toks []int32) []result {
	t.Helper()
	e := newEngine(t)
	if len(prefix) > 0 {
		if _, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: prefix}}, nil); err != nil {
			t.Fatalf("reference Prefill of %d tokens: %v", len(prefix), err)
		}
	}
	return decodeForced(t, e, 1, toks, engine.Sampling{})
}

// sameKV fails unless every layer of a and b holds the same KV for
// tokens [0, n).
func sameKV(t *testing.T, e engine.Engine, a, b engine.SeqID, n int) {
	t.Helper()
	for l := range e.Spec().Layers {
		ka, err := e.ExportKV(a, l, 0, n, nil)
		if err != nil {
			t.Fatalf("ExportKV(seq %d, layer %d, 0, %d): %v", a, l, n, err)
		}
		kb, err := e.ExportKV(b, l, 0, n, nil)
		if err != nil {
			t.Fatalf("ExportKV(seq %d, layer %d, 0, %d): %v", b, l, n, err)
		}
		if !bytes.Equal(ka, kb) {
			t.Fatalf("layer %d: KV of tokens [0, %d) of seq %d differs from seq %d's", l, n, b, a)
		}
	}
}

func forker(t *testing.T, e engine.Engine) engine.Forker {
	t.Helper()
	f, ok := e.(engine.Forker)
	if !ok {
		t.Skip("the engine does not implement engine.Forker")
	}
	return f
}

// testFork: a fork decodes as a fresh sequence prefilled with the same
// prefix would, and its source as if no fork had happened.
func (c *config) testFork(t *testing.T, newEngine NewFunc) {
	ctx := context.Background()
	spec := newEngine(t).Spec()
	p := prompt(spec, 12, 60)
	d := prompt(spec, 2, 61) // decoded into the source before the fork
	a := prompt(spec, 4, 62) // the source's tokens after the fork
	b := prompt(spec, 6, 63) // the fork's tokens
	x := slices.Concat(p, d) // what the source holds at the fork
	srcWant := reference(t, newEngine, x, a)

	// setup returns an engine whose seq 1 holds x: prompt p (a token
	// sampled after it) and two decoded tokens.
	setup := func(t *testing.T) (engine.Engine, engine.Forker) {
		e := newEngine(t)
		f := forker(t, e)
		prefill(t, e, 1, p, engine.Sampling{})
		decodeForced(t, e, 1, d, engine.Sampling{})
		wantLen(t, e, 1, len(x))
		return e, f
	}

	t.Run("whole sequence", func(t *testing.T) {
		e, f := setup(t)
		if err := f.Fork(1, 2, len(x)); err != nil {
			t.Fatalf("Fork(1, 2, %d): %v", len(x), err)
		}
		wantLen(t, e, 1, len(x))
		wantLen(t, e, 2, len(x))
		sameKV(t, e, 1, 2, len(x))
		// Both decode in the same batches, then the source is freed and
		// the fork goes on alone.
		var src, dst []result
		for i := range 3 {
			outs, err := e.Decode(ctx, []engine.DecodeItem{{Seq: 1, Token: a[i]}, {Seq: 2, Token: b[i]}})
			if err != nil {
				t.Fatalf("Decode step %d: %v", i, err)
			}
			checkOutputs(t, spec, outs, []engine.SeqID{1, 2}, []bool{true, true})
			src = append(src, resultOf(outs[0]))
			dst = append(dst, resultOf(outs[1]))
		}
		e.Free(1)
		_, err := e.Len(1)
		wantErr(t, "Len of the freed source", err, engine.ErrUnknownSeq)
		dst = append(dst, decodeForced(t, e, 2, b[3:], engine.Sampling{})...)
		wantLen(t, e, 2, len(x)+len(b))
		c.checkResults(t, "source decoded next to its fork", srcWant[:3], src)
		c.checkResults(t, "fork, source freed after 3 steps", reference(t, newEngine, x, b), dst)
	})

	t.Run("prefix", func(t *testing.T) {
		e, f := setup(t)
		const n = 7
		if err := f.Fork(1, 2, n); err != nil {
			t.Fatalf("Fork(1, 2, %d): %v", n, err)
		}
		wantLen(t, e, 2, n)
		wantLen(t, e, 1, len(x))
		sameKV(t, e, 1, 2, n)
		// A fork of the fork, then the first fork is freed.
		dst := decodeForced(t, e, 2, b[:3], engine.Sampling{})
		if err := f.Fork(2, 3, n+2); err != nil {
			t.Fatalf("Fork(2, 3, %d): %v", n+2, err)
		}
		e.Free(2)
		wantLen(t, e, 3, n+2)
		c.checkResults(t, "fork of a 7-token prefix", reference(t, newEngine, x[:n], b[:3]), dst)
		c.checkResults(t, "fork of a fork", reference(t, newEngine, slices.Concat(x[:n], b[:2]), b[3:]), decodeForced(t, e, 3, b[3:], engine.Sampling{}))
		// The source never noticed.
		c.checkResults(t, "source after its forks were decoded and freed", srcWant, decodeForced(t, e, 1, a, engine.Sampling{}))
		wantLen(t, e, 3, n+2+len(b[3:]))
	})

	t.Run("empty prefix", func(t *testing.T) {
		e, f := setup(t)
		if err := f.Fork(1, 2, 0); err != nil {
			t.Fatalf("Fork(1, 2, 0): %v", err)
		}
		wantLen(t, e, 2, 0)
		outs, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 2, Tokens: b[:3]}}, nil)
		if err != nil {
			t.Fatalf("Prefill onto an empty fork: %v", err)
		}
		checkOutputs(t, spec, outs, []engine.SeqID{2}, []bool{false})
		c.checkResults(t, "empty fork prefilled", reference(t, newEngine, b[:3], b[3:]), decodeForced(t, e, 2, b[3:], engine.Sampling{}))
	})

	t.Run("free the fork", func(t *testing.T) {
		e, f := setup(t)
		for i, n := range []int{len(x), 5} {
			dst := engine.SeqID(10 + i)
			if err := f.Fork(1, dst, n); err != nil {
				t.Fatalf("Fork(1, %d, %d): %v", dst, n, err)
			}
			decodeForced(t, e, dst, b[:2], engine.Sampling{})
			e.Free(dst)
			_, err := e.Len(dst)
			wantErr(t, "Len of the freed fork", err, engine.ErrUnknownSeq)
		}
		wantLen(t, e, 1, len(x))
		c.checkResults(t, "source after its forks were freed", srcWant, decodeForced(t, e, 1, a, engine.Sampling{}))
		// The freed id is free again.
		if err := f.Fork(1, 10, 3); err != nil {
			t.Fatalf("Fork into a freed id: %v", err)
		}
		wantLen(t, e, 10, 3)
	})

	t.Run("imported source", func(t *testing.T) {
		e, _ := setup(t)
		g := newEngine(t)
		f := forker(t, g)
		for l := range spec.Layers {
			data, err := e.ExportKV(1, l, 0, len(x), nil)
			if err != nil {
				t.Fatalf("ExportKV layer %d: %v", l, err)
			}
			if err := g.ImportKV(5, l, 0, data); err != nil {
				t.Fatalf("ImportKV layer %d: %v", l, err)
			}
		}
		if err := f.Fork(5, 6, len(x)-1); err != nil {
			t.Fatalf("Fork of an imported sequence: %v", err)
		}
		sameKV(t, g, 5, 6, len(x)-1)
		c.checkResults(t, "fork of imported KV", reference(t, newEngine, x[:len(x)-1], b[:3]), decodeForced(t, g, 6, b[:3], engine.Sampling{}))
		c.checkResults(t, "imported source after the fork", srcWant, decodeForced(t, g, 5, a, engine.Sampling{}))
	})
}

func testForkErrors(t *testing.T, newEngine NewFunc) {
	e := newEngine(t)
	f := forker(t, e)
	spec := e.Spec()
	p := prompt(spec, 6, 64)
	prefill(t, e, 1, p, engine.Sampling{})
	prefill(t, e, 2, p[:3], engine.Sampling{})
	tests := []struct {
		name     string
		src, dst engine.SeqID
		n        int
		want     error
	}{
		{"unknown source", 9, 5, 0, engine.ErrUnknownSeq},
		{"live destination", 1, 2, 3, engine.ErrDuplicateSeq},
		{"destination is the source", 1, 1, 3, engine.ErrDuplicateSeq},
		{"negative length", 1, 5, -1, engine.ErrRange},
		{"past the source", 1, 5, len(p) + 1, engine.ErrRange},
	}
	for _, tc := range tests {
		err := f.Fork(tc.src, tc.dst, tc.n)
		wantErr(t, fmt.Sprintf("%s: Fork(%d, %d, %d)", tc.name, tc.src, tc.dst, tc.n), err, tc.want)
	}
	if spec.Layers >= 2 {
		data, err := e.ExportKV(1, 0, 0, len(p), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.ImportKV(7, 0, 0, data); err != nil {
			t.Fatalf("ImportKV: %v", err)
		}
		err = f.Fork(7, 5, 1)
		wantErr(t, "Fork of a sequence with one layer imported", err, engine.ErrIncompleteKV)
	}
	_, err := e.Len(5)
	wantErr(t, "Len of a fork that failed", err, engine.ErrUnknownSeq)
	wantLen(t, e, 1, len(p))
	wantLen(t, e, 2, 3)
}

// testAllLogits: the rows of an AllLogits chunk are the Last logits of
// prefills of each prefix, whatever the chunking and the batch.
func (c *config) testAllLogits(t *testing.T, newEngine NewFunc) {
	ctx := context.Background()
	e := newEngine(t)
	spec := e.Spec()
	v := spec.Vocab
	p := prompt(spec, 13, 70)
	q := prompt(spec, 5, 71)

	// want[i]: the logits after p[:i+1], each prefix prefilled alone.
	alone := newEngine(t)
	want := make([][]float32, len(p))
	for i := range p {
		outs, err := alone.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p[:i+1], Last: true}}, nil)
		if err != nil {
			t.Fatalf("Prefill of p[:%d]: %v", i+1, err)
		}
		want[i] = slices.Clone(outs[0].Logits)
		alone.Free(1)
	}
	if want[0] == nil {
		outs, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p, Last: true, AllLogits: true}}, nil)
		if err != nil {
			t.Fatalf("Prefill with AllLogits: %v", err)
		}
		if outs[0].AllLogits != nil {
			t.Errorf("an engine without logits returned %d AllLogits values, want nil", len(outs[0].AllLogits))
		}
		t.Skip("the engine computes no logits")
	}
	// rows checks an item's AllLogits against want[from:from+n].
	rows := func(t *testing.T, what string, o engine.Output, from, n int) {
		t.Helper()
		if len(o.AllLogits) != n*v {
			t.Fatalf("%s: %d AllLogits values, want %d rows of %d", what, len(o.AllLogits), n, v)
		}
		for i := range n {
			c.checkLogits(t, fmt.Sprintf("%s, row %d (after prompt token %d)", what, i, from+i), want[from+i], o.AllLogits[i*v:(i+1)*v])
		}
	}

	t.Run("one chunk", func(t *testing.T) {
		outs, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p, Last: true, AllLogits: true}}, nil)
		if err != nil {
			t.Fatalf("Prefill: %v", err)
		}
		checkOutputs(t, spec, outs, []engine.SeqID{1}, []bool{true})
		rows(t, "whole prompt", outs[0], 0, len(p))
		if !slices.Equal(outs[0].Logits, outs[0].AllLogits[(len(p)-1)*v:]) {
			t.Errorf("Logits differ from the last AllLogits row")
		}
		if tok := engine.Sample(want[len(p)-1], engine.Sampling{}, len(p), nil); outs[0].Token != tok {
			t.Errorf("sampled token %d, want %d (the prompt alone)", outs[0].Token, tok)
		}
	})

	t.Run("chunks", func(t *testing.T) {
		chunks := []struct {
			lo, hi    int
			all, last bool
		}{{0, 5, true, false}, {5, 9, false, false}, {9, 13, true, true}}
		for _, ch := range chunks {
			outs, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 2, Tokens: p[ch.lo:ch.hi], Last: ch.last, AllLogits: ch.all}}, nil)
			if err != nil {
				t.Fatalf("Prefill chunk [%d, %d): %v", ch.lo, ch.hi, err)
			}
			checkOutputs(t, spec, outs, []engine.SeqID{2}, []bool{ch.last})
			what := fmt.Sprintf("chunk [%d, %d)", ch.lo, ch.hi)
			if !ch.all {
				if outs[0].AllLogits != nil {
					t.Errorf("%s without AllLogits: %d AllLogits values, want nil", what, len(outs[0].AllLogits))
				}
				continue
			}
			rows(t, what, outs[0], ch.lo, ch.hi-ch.lo)
		}
	})

	t.Run("mixed step", func(t *testing.T) {
		g := newEngine(t)
		if _, err := g.Prefill(ctx, []engine.PrefillItem{{Seq: 3, Tokens: p[:4]}}, nil); err != nil {
			t.Fatal(err)
		}
		f4 := prefill(t, g, 4, q, engine.Sampling{})
		decWant := reference(t, newEngine, q, []int32{f4})
		items := []engine.PrefillItem{
			{Seq: 5, Tokens: p, Last: true, AllLogits: true},
			{Seq: 6, Tokens: q, Last: true},
			{Seq: 3, Tokens: p[4:], AllLogits: true},
		}
		dec := []engine.DecodeItem{{Seq: 4, Token: f4}}
		checkPrefill := func(pOut []engine.Output) {
			t.Helper()
			checkOutputs(t, spec, pOut, []engine.SeqID{5, 6, 3}, []bool{true, true, false})
			rows(t, "seq 5 (whole prompt)", pOut[0], 0, len(p))
			if pOut[1].AllLogits != nil {
				t.Errorf("seq 6 without AllLogits: %d AllLogits values, want nil", len(pOut[1].AllLogits))
			}
			rows(t, "seq 3 (prompt after 4 tokens)", pOut[2], 4, len(p)-4)
		}
		var dOut []engine.Output
		if st, ok := g.(engine.Stepper); ok {
			pOut, d, err := st.Step(ctx, items, dec, nil)
			if err != nil {
				t.Fatalf("Step: %v", err)
			}
			checkPrefill(pOut)
			dOut = d
		} else {
			// Without a mixed step, the prefill's logits are valid only
			// until the decode call.
			pOut, err := g.Prefill(ctx, items, nil)
			if err != nil {
				t.Fatalf("Prefill: %v", err)
			}
			checkPrefill(pOut)
			if dOut, err = g.Decode(ctx, dec); err != nil {
				t.Fatalf("Decode: %v", err)
			}
		}
		checkOutputs(t, spec, dOut, []engine.SeqID{4}, []bool{true})
		c.checkResults(t, "decode next to AllLogits chunks", decWant, []result{resultOf(dOut[0])})
	})
}

// testPenalties: Sampling.Penalties shift the logits a token is sampled
// from, never the logits returned.
func (c *config) testPenalties(t *testing.T, newEngine NewFunc) {
	ctx := context.Background()
	e := newEngine(t)
	spec := e.Spec()
	p := prompt(spec, 9, 80)
	outs, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p, Last: true}}, nil)
	if err != nil {
		t.Fatalf("Prefill: %v", err)
	}
	plain := resultOf(outs[0])
	if plain.logits == nil {
		pen := &engine.Penalties{Presence: 2, Frequency: 2, Counts: map[int32]int32{plain.tok: 1}}
		if _, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 2, Tokens: p, Last: true, Sampling: engine.Sampling{Penalties: pen}}}, nil); err != nil {
			t.Fatalf("Prefill with penalties: %v", err)
		}
		t.Skip("the engine computes no logits")
	}

	// A large penalty on the greedy token: another token wins, sampled
	// from the penalised copy of the unchanged logits.
	pen := &engine.Penalties{Presence: 2, Frequency: 2, Counts: map[int32]int32{plain.tok: 50}}
	counts := maps.Clone(pen.Counts)
	s := engine.Sampling{Penalties: pen}
	outs, err = e.Prefill(ctx, []engine.PrefillItem{{Seq: 2, Tokens: p, Last: true, Sampling: s}}, nil)
	if err != nil {
		t.Fatalf("Prefill with penalties: %v", err)
	}
	got := resultOf(outs[0])
	c.checkLogits(t, "logits returned with penalties (must be raw)", plain.logits, got.logits)
	if got.tok == plain.tok {
		t.Errorf("a penalty of 102 on the greedy token %d left it chosen", plain.tok)
	}
	if want := engine.Sample(outs[0].Logits, s, len(p), nil); got.tok != want {
		t.Errorf("token %d with penalties, want %d (engine.Sample of the returned logits)", got.tok, want)
	}
	if !maps.Equal(counts, pen.Counts) {
		t.Errorf("the engine changed the penalty counts: %v, were %v", pen.Counts, counts)
	}

	// Inactive penalties change nothing.
	outs, err = e.Prefill(ctx, []engine.PrefillItem{{Seq: 3, Tokens: p, Last: true, Sampling: engine.Sampling{Penalties: &engine.Penalties{Counts: map[int32]int32{plain.tok: 50}}}}}, nil)
	if err != nil {
		t.Fatalf("Prefill with zero penalties: %v", err)
	}
	if outs[0].Token != plain.tok {
		t.Errorf("zero penalties: token %d, want %d", outs[0].Token, plain.tok)
	}

	// Decoding with penalties that count what was generated, greedy and
	// seeded, mixed in one batch with an unpenalised sequence.
	pens := []*engine.Penalties{
		{Presence: 1.5, Frequency: 0.5},
		{Presence: 0.5, Frequency: 1},
	}
	samplings := []engine.Sampling{
		{Penalties: pens[0]},
		{Temperature: 0.9, Seed: 17, Penalties: pens[1]},
	}
	next := []int32{got.tok, outs[0].Token, plain.tok}
	for i := range pens {
		pens[i].Add(next[i])
	}
	for step := range 6 {
		batch := []engine.DecodeItem{
			{Seq: 2, Token: next[0], Sampling: samplings[0]},
			{Seq: 3, Token: next[1], Sampling: samplings[1]},
			{Seq: 1, Token: next[2]},
		}
		outs, err := e.Decode(ctx, batch)
		if err != nil {
			t.Fatalf("Decode step %d: %v", step, err)
		}
		checkOutputs(t, spec, outs, []engine.SeqID{2, 3, 1}, []bool{true, true, true})
		for i, o := range outs {
			pos := len(p) + step + 1
			if want := engine.Sample(o.Logits, batch[i].Sampling, pos, nil); o.Token != want {
				t.Errorf("step %d seq %d: token %d, want %d (engine.Sample of the returned logits with the item's sampling)", step, o.Seq, o.Token, want)
			}
			next[i] = o.Token
			if i < len(pens) {
				pens[i].Add(o.Token)
			}
		}
	}
	if diff := cmp.Diff(map[engine.SeqID]int{1: len(p) + 6, 2: len(p) + 6, 3: len(p) + 6}, lens(t, e, 1, 2, 3)); diff != "" {
		t.Errorf("lengths after decoding (-want +got):\n%s", diff)
	}
}

func lens(t *testing.T, e engine.Engine, seqs ...engine.SeqID) map[engine.SeqID]int {
	t.Helper()
	m := map[engine.SeqID]int{}
	for _, s := range seqs {
		n, err := e.Len(s)
		if err != nil {
			t.Fatalf("Len(%d): %v", s, err)
		}
		m[s] = n
	}
	return m
}
