package workload

import (
	"fmt"
	"math"
)

// RandomOptions are vLLM's random dataset parameters.
type RandomOptions struct {
	InputLen  int // mean prompt length in tokens, excluding the prefix; ≥ 1
	OutputLen int // mean output length in tokens; ≥ 1
	// RangeRatio r in [0, 1): lengths are uniform integers in
	// [floor(len·(1−r)), floor(len·(1+r))], as in vLLM ≥ 0.9.
	RangeRatio float64
	PrefixLen  int // tokens of one random prefix shared by every prompt; ≥ 0
}

// Validate reports out-of-range options.
func (o RandomOptions) Validate() error {
	switch {
	case o.InputLen < 1 || o.OutputLen < 1:
		return fmt.Errorf("%w: random input and output lengths must be ≥ 1 (got %d, %d)", ErrBadOption, o.InputLen, o.OutputLen)
	case o.RangeRatio < 0 || o.RangeRatio >= 1 || math.IsNaN(o.RangeRatio):
		return fmt.Errorf("%w: random range ratio %v not in [0, 1)", ErrBadOption, o.RangeRatio)
	case o.PrefixLen < 0:
		return fmt.Errorf("%w: random prefix length %d < 0", ErrBadOption, o.PrefixLen)
	}
	return nil
}

// Random returns n requests with vLLM's random-dataset lengths. Every prompt
// starts with the same PrefixLen tokens, then InputLen-ish tokens of its own.
func Random(o RandomOptions, n int, seed uint64, s Synth) (*Workload, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if n < 1 {
		return nil, fmt.Errorf("%w: number of prompts %d < 1", ErrBadOption, n)
	}
	lens := newRand(seed, streamLengths)
	prefix := &Prompt{}
	s.Append(prefix, newRand(seed, streamPrefix), o.PrefixLen)
	inLo, inHi := rangeOf(o.InputLen, o.RangeRatio)
	outLo, outHi := rangeOf(o.OutputLen, o.RangeRatio)
	w := &Workload{
		Description: fmt.Sprintf("random in=%d out=%d range-ratio=%g prefix=%d", o.InputLen, o.OutputLen, o.RangeRatio, o.PrefixLen),
		Requests:    make([]Request, n),
	}
	for i := range w.Requests {
		in := inLo + lens.IntN(inHi-inLo+1)
		out := outLo + lens.IntN(outHi-outLo+1)
		w.Requests[i] = Request{
			Index: i, PromptLen: o.PrefixLen + in, OutputLen: out,
			recipe: &recipe{synth: s, seed: seed, prefix: prefix, total: o.PrefixLen + in},
		}
	}
	return w, nil
}

// rangeOf returns vLLM's inclusive length range for mean l and ratio r,
// never below 1.
func rangeOf(l int, r float64) (lo, hi int) {
	lo = int(float64(l) * (1 - r))
	hi = int(float64(l) * (1 + r))
	lo = max(lo, 1)
	hi = max(hi, lo)
	return lo, hi
}

func (p *Prompt) clone() Prompt {
	var c Prompt
	c.text = append([]byte(nil), p.text...)
	c.ids = append([]int32(nil), p.ids...)
	c.n = p.n
	return c
}
