package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
)

// Dist is a distribution of token lengths, given as parameters. Draws are
// rounded to integers and clamped to [Min, Max].
//
// Spelling (ParseDist): KIND:key=value,... with kinds
//
//	const:value=N
//	uniform:min=A,max=B            integers in [A, B]
//	normal:mean=M,std=S
//	lognormal:mean=M,std=S         M and S are the lengths' own mean and std
//	exponential:mean=M
//
// and optional min= (default 1) and max= (default unbounded) clamps on
// every kind, e.g. "lognormal:mean=755,std=400,max=4096".
type Dist struct {
	Kind      string
	Mean, Std float64 // normal, lognormal, exponential (Mean); const (Mean)
	Min, Max  int     // clamp; Max 0 means unbounded
	spec      string
}

// ParseDist parses the spelling described on Dist.
func ParseDist(spec string) (Dist, error) {
	kind, args, _ := strings.Cut(spec, ":")
	d := Dist{Kind: kind, Min: 1, spec: spec}
	vals := map[string]float64{}
	if args != "" {
		for _, kv := range strings.Split(args, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return Dist{}, fmt.Errorf("%w: length distribution %q: %q is not key=value", ErrBadOption, spec, kv)
			}
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
				return Dist{}, fmt.Errorf("%w: length distribution %q: %s=%q is not a number", ErrBadOption, spec, k, v)
			}
			vals[strings.TrimSpace(k)] = f
		}
	}
	need := func(keys ...string) error {
		allowed := map[string]bool{"min": true, "max": true}
		for _, k := range keys {
			allowed[k] = true
			if _, ok := vals[k]; !ok {
				return fmt.Errorf("%w: length distribution %q: %s needs %s=", ErrBadOption, spec, kind, k)
			}
		}
		var extra []string
		for k := range vals {
			if !allowed[k] {
				extra = append(extra, k)
			}
		}
		if len(extra) > 0 {
			sort.Strings(extra)
			return fmt.Errorf("%w: length distribution %q: unknown keys %v", ErrBadOption, spec, extra)
		}
		return nil
	}
	var err error
	switch kind {
	case "const":
		err = need("value")
		d.Mean = vals["value"]
	case "uniform":
		err = need("min", "max")
	case "normal", "lognormal":
		err = need("mean", "std")
		d.Mean, d.Std = vals["mean"], vals["std"]
	case "exponential":
		err = need("mean")
		d.Mean = vals["mean"]
	default:
		return Dist{}, fmt.Errorf("%w: length distribution %q: kind %q: want const, uniform, normal, lognormal or exponential", ErrBadOption, spec, kind)
	}
	if err != nil {
		return Dist{}, err
	}
	if v, ok := vals["min"]; ok {
		d.Min = int(v)
	}
	if v, ok := vals["max"]; ok {
		d.Max = int(v)
	}
	switch {
	case d.Min < 1:
		return Dist{}, fmt.Errorf("%w: length distribution %q: min %d < 1", ErrBadOption, spec, d.Min)
	case d.Max != 0 && d.Max < d.Min:
		return Dist{}, fmt.Errorf("%w: length distribution %q: max %d < min %d", ErrBadOption, spec, d.Max, d.Min)
	case d.Std < 0:
		return Dist{}, fmt.Errorf("%w: length distribution %q: std < 0", ErrBadOption, spec)
	case (kind == "lognormal" || kind == "exponential") && d.Mean <= 0:
		return Dist{}, fmt.Errorf("%w: length distribution %q: mean must be > 0", ErrBadOption, spec)
	}
	return d, nil
}

// String returns the spelling the Dist was parsed from.
func (d Dist) String() string { return d.spec }

// Draw returns one length from rng.
func (d Dist) Draw(rng *rand.Rand) int {
	var x float64
	switch d.Kind {
	case "const":
		x = d.Mean
	case "uniform":
		hi := d.Max
		return d.Min + rng.IntN(hi-d.Min+1)
	case "normal":
		x = d.Mean + d.Std*rng.NormFloat64()
	case "lognormal":
		s2 := math.Log1p(d.Std * d.Std / (d.Mean * d.Mean))
		mu := math.Log(d.Mean) - s2/2
		x = math.Exp(mu + math.Sqrt(s2)*rng.NormFloat64())
	case "exponential":
		x = d.Mean * rng.ExpFloat64()
	}
	n := int(math.Round(x))
	n = max(n, d.Min)
	if d.Max > 0 {
		n = min(n, d.Max)
	}
	return n
}

// FromDists returns n requests whose lengths are drawn from in and out.
// Every prompt starts with the same prefixLen (≥ 0) tokens, as the random
// dataset's prefix, then its own drawn length: a shared system prompt.
func FromDists(in, out Dist, prefixLen, n int, seed uint64, s Synth) (*Workload, error) {
	if n < 1 {
		return nil, fmt.Errorf("%w: number of prompts %d < 1", ErrBadOption, n)
	}
	if prefixLen < 0 {
		return nil, fmt.Errorf("%w: prefix length %d < 0", ErrBadOption, prefixLen)
	}
	if in.Kind == "" || out.Kind == "" {
		return nil, fmt.Errorf("%w: dist dataset needs input and output length distributions", ErrBadOption)
	}
	lens := newRand(seed, streamLengths)
	w := &Workload{
		Description: fmt.Sprintf("dist in=%s out=%s", in, out),
		Requests:    make([]Request, n),
	}
	var prefix *Prompt
	if prefixLen > 0 {
		prefix = &Prompt{}
		s.Append(prefix, newRand(seed, streamPrefix), prefixLen)
		w.Description += fmt.Sprintf(" prefix=%d", prefixLen)
	}
	for i := range w.Requests {
		pl, ol := in.Draw(lens), out.Draw(lens)
		pl += prefixLen
		w.Requests[i] = Request{Index: i, PromptLen: pl, OutputLen: ol, recipe: &recipe{synth: s, seed: seed, prefix: prefix, total: pl}}
	}
	return w, nil
}
