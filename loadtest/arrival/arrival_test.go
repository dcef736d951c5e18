package arrival

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// A long schedule's mean rate and interval CV must match the process.
// Stated tolerances: mean rate within 2%, CV within 4%. With n = 100,000
// intervals the relative standard error of the mean interval is CV/√n
// (0.3% at CV 1, 0.7% at CV 2.2) and that of the sample CV at most about
// 0.9% (burstiness 0.2, whose intervals have kurtosis 33), so both bounds
// are four or more standard errors: a correct generator passes for any
// seed, a wrong mean or shape does not.
func TestGammaRateAndCV(t *testing.T) {
	const n = 100_001
	for _, tc := range []struct {
		rate, burstiness float64
	}{
		{rate: 10, burstiness: 1},    // Poisson: CV 1
		{rate: 2.5, burstiness: 0.2}, // bursty: CV √5 ≈ 2.24
		{rate: 40, burstiness: 4},    // regular: CV 0.5
		{rate: 1, burstiness: 0.5},
	} {
		for _, seed := range []uint64{1, 2} {
			t.Run(fmt.Sprintf("rate=%g/b=%g/seed=%d", tc.rate, tc.burstiness, seed), func(t *testing.T) {
				s, err := Gamma(n, tc.rate, tc.burstiness, seed)
				if err != nil {
					t.Fatal(err)
				}
				if s[0] != 0 {
					t.Errorf("first offset %v, want 0", s[0])
				}
				for i := 1; i < n; i++ {
					if s[i] < s[i-1] {
						t.Fatalf("offset %d (%v) before offset %d (%v)", i, s[i], i-1, s[i-1])
					}
				}
				if r := MeanRate(s); math.Abs(r-tc.rate)/tc.rate > 0.02 {
					t.Errorf("mean rate %.4f, want %g ± 2%%", r, tc.rate)
				}
				wantCV := 1 / math.Sqrt(tc.burstiness)
				if _, cv := IntervalStats(s); math.Abs(cv-wantCV)/wantCV > 0.04 {
					t.Errorf("interval CV %.4f, want %.4f ± 4%%", cv, wantCV)
				}
			})
		}
	}
}

func TestGammaRepeatable(t *testing.T) {
	a, _ := Gamma(100, 3, 0.7, 42)
	b, _ := Gamma(100, 3, 0.7, 42)
	c, _ := Gamma(100, 3, 0.7, 43)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("same seed, different schedules (-a +b):\n%s", diff)
	}
	if cmp.Equal(a, c) {
		t.Error("seeds 42 and 43 gave the same schedule")
	}
	p, _ := Poisson(100, 3, 42)
	g, _ := Gamma(100, 3, 1, 42)
	if !cmp.Equal(p, g) {
		t.Error("Poisson differs from Gamma with burstiness 1")
	}
}

func TestInfiniteRate(t *testing.T) {
	s, err := Gamma(5, math.Inf(1), 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(make([]time.Duration, 5), s); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestBadParams(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"zero rate", func() error { _, e := Gamma(3, 0, 1, 0); return e }()},
		{"nan rate", func() error { _, e := Gamma(3, math.NaN(), 1, 0); return e }()},
		{"zero burstiness", func() error { _, e := Gamma(3, 1, 0, 0); return e }()},
		{"negative n", func() error { _, e := Gamma(-1, 1, 1, 0); return e }()},
		{"zero scale", func() error { _, e := Trace([]time.Duration{0}, 0); return e }()},
		{"unsorted trace", func() error { _, e := Trace([]time.Duration{0, 2, 1}, 1); return e }()},
		{"flat trace rate", func() error { _, e := ScaleForRate([]time.Duration{0, 0}, 1); return e }()},
		{"inf target rate", func() error { _, e := ScaleForRate([]time.Duration{0, 1}, math.Inf(1)); return e }()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !errors.Is(tc.err, ErrBadParam) {
				t.Errorf("got %v, want ErrBadParam", tc.err)
			}
		})
	}
}

func TestTraceScale(t *testing.T) {
	in := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}
	got, err := Trace(in, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{0, 500 * time.Millisecond, 1500 * time.Millisecond}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	f, err := ScaleForRate(in, 4)
	if err != nil {
		t.Fatal(err)
	}
	scaled, _ := Trace(in, f)
	if r := MeanRate(scaled); math.Abs(r-4) > 1e-9 {
		t.Errorf("scaled to rate %v, want 4", r)
	}
	// Scaling keeps the trace's burstiness.
	_, cv0 := IntervalStats(in)
	_, cv1 := IntervalStats(scaled)
	if math.Abs(cv0-cv1) > 1e-6 { // offsets round to 1 ns
		t.Errorf("CV %v after scaling, %v before", cv1, cv0)
	}
}
