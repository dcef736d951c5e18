package arrival

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// ErrBadParam reports an invalid rate, burstiness or scale.
var ErrBadParam = errors.New("arrival: bad parameter")

// Gamma returns n send offsets whose intervals are gamma distributed with
// shape burstiness (> 0) and mean 1/rate seconds (rate > 0, in requests per
// second). The first request is sent at 0. rate = +Inf sends everything at 0
// (closed loop under a concurrency limit). Burstiness 1 is a Poisson
// process; below 1 is burstier, above 1 more regular.
func Gamma(n int, rate, burstiness float64, seed uint64) ([]time.Duration, error) {
	if n < 0 {
		return nil, fmt.Errorf("%w: %d requests", ErrBadParam, n)
	}
	if math.IsNaN(rate) || rate <= 0 {
		return nil, fmt.Errorf("%w: rate %v req/s, want > 0 (inf for all at once)", ErrBadParam, rate)
	}
	if math.IsNaN(burstiness) || math.IsInf(burstiness, 0) || burstiness <= 0 {
		return nil, fmt.Errorf("%w: burstiness %v, want > 0", ErrBadParam, burstiness)
	}
	out := make([]time.Duration, n)
	if math.IsInf(rate, 1) {
		return out, nil
	}
	rng := rand.New(rand.NewPCG(seed, 0x61727276))
	scale := 1 / (rate * burstiness)
	t := 0.0
	for i := 1; i < n; i++ {
		t += scale * gamma(rng, burstiness)
		out[i] = seconds(t)
	}
	return out, nil
}

// Poisson is Gamma with burstiness 1.
func Poisson(n int, rate float64, seed uint64) ([]time.Duration, error) {
	return Gamma(n, rate, 1, seed)
}

// Trace returns trace offsets multiplied by scale (> 0): 0.5 replays twice
// as fast. offsets must be non-decreasing; the result is a new slice.
func Trace(offsets []time.Duration, scale float64) ([]time.Duration, error) {
	if math.IsNaN(scale) || math.IsInf(scale, 0) || scale <= 0 {
		return nil, fmt.Errorf("%w: time scale %v, want > 0", ErrBadParam, scale)
	}
	out := make([]time.Duration, len(offsets))
	for i, o := range offsets {
		if i > 0 && o < offsets[i-1] {
			return nil, fmt.Errorf("%w: trace offset %d (%v) before offset %d (%v)", ErrBadParam, i, o, i-1, offsets[i-1])
		}
		out[i] = seconds((o - offsets[0]).Seconds() * scale)
	}
	return out, nil
}

// MeanRate returns the mean rate of a schedule in requests per second:
// (n − 1) / span, or +Inf when the span is 0 and n > 1, or 0 when n < 2.
func MeanRate(offsets []time.Duration) float64 {
	n := len(offsets)
	if n < 2 {
		return 0
	}
	span := (offsets[n-1] - offsets[0]).Seconds()
	if span <= 0 {
		return math.Inf(1)
	}
	return float64(n-1) / span
}

// ScaleForRate returns the factor that makes Trace(offsets, factor) have
// mean rate rate (> 0): MeanRate(offsets) / rate.
func ScaleForRate(offsets []time.Duration, rate float64) (float64, error) {
	m := MeanRate(offsets)
	if m == 0 || math.IsInf(m, 1) {
		return 0, fmt.Errorf("%w: a trace of %d requests over 0 s has no rate to scale", ErrBadParam, len(offsets))
	}
	if math.IsNaN(rate) || math.IsInf(rate, 0) || rate <= 0 {
		return 0, fmt.Errorf("%w: rate %v req/s, want finite and > 0", ErrBadParam, rate)
	}
	return m / rate, nil
}

// IntervalStats returns the mean (seconds) and coefficient of variation
// (population std / mean) of a schedule's intervals; zeros for n < 2.
func IntervalStats(offsets []time.Duration) (mean, cv float64) {
	n := len(offsets) - 1
	if n < 1 {
		return 0, 0
	}
	var sum, sq float64
	for i := 1; i <= n; i++ {
		d := (offsets[i] - offsets[i-1]).Seconds()
		sum += d
		sq += d * d
	}
	mean = sum / float64(n)
	if mean == 0 {
		return 0, 0
	}
	v := sq/float64(n) - mean*mean
	return mean, math.Sqrt(max(v, 0)) / mean
}

func seconds(s float64) time.Duration { return time.Duration(math.Round(s * 1e9)) }

// gamma draws from Gamma(shape k, scale 1) by Marsaglia and Tsang's method,
// boosted for k < 1.
func gamma(rng *rand.Rand, k float64) float64 {
	if k < 1 {
		u := rng.Float64()
		for u == 0 {
			u = rng.Float64()
		}
		return gamma(rng, k+1) * math.Pow(u, 1/k)
	}
	d := k - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		var x, v float64
		for v <= 0 {
			x = rng.NormFloat64()
			v = 1 + c*x
		}
		v = v * v * v
		u := rng.Float64()
		if u < 1-0.0331*x*x*x*x {
			return d * v
		}
		if u > 0 && math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v
		}
	}
}
