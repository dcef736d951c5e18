package planner

import (
	"testing"
)

// The colocated simulation prices its mixed steps (chunks beside decode
// tokens) through the profile's step time, mixed-step term included: a
// profile with the term predicts a higher colocated TPOT and lower
// attainment than the same profile without it, and leaves 1P+1D alone.
func TestColocatedPricesTheMixedStepTerm(t *testing.T) {
	run := func(mixed [3]float64, d Design) *simResult {
		cfg := opt13(t)
		p := *cfg.Prefill
		ds := *p.DistServe
		ds.Mixed = mixed
		p.DistServe = &ds
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
		cfg.Prefill = &p
		return newSearcher(cfg).sim.run(d, 3, false)
	}
	term := [3]float64{5, 0.002, 2e-6} // ms; a 512-token chunk beside 8 × 600 context: +20 ms
	coloc := Design{Colocated: 1, Chunk: 512}
	plain, with := run([3]float64{}, coloc), run(term, coloc)
	if !(with.TPOT.Mean > plain.TPOT.Mean*1.05) || with.Attainment > plain.Attainment {
		t.Errorf("colocated TPOT mean %.2f ms with the term, %.2f ms without; attainment %.3f, %.3f: want the term to cost",
			with.TPOT.Mean*1e3, plain.TPOT.Mean*1e3, with.Attainment, plain.Attainment)
	}
	disagg := Design{Prefill: 1, Decode: 1}
	if a, b := run([3]float64{}, disagg), run(term, disagg); a.TPOT != b.TPOT || a.TTFT != b.TTFT {
		t.Errorf("1P+1D changed with the mixed term: TPOT %+v vs %+v", a.TPOT, b.TPOT)
	}
}
