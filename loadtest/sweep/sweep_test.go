package sweep_test

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/loadtest/metrics"
	"github.com/pdserve/pdserve/loadtest/sweep"
)

// capacity returns a probe of a deployment whose attainment is 1 up to
// limit req/s and falls linearly to 0 at 2×limit; it records the rates.
func capacity(limit float64, rates *[]float64) sweep.Probe {
	return func(_ context.Context, r float64) (metrics.Summary, error) {
		*rates = append(*rates, r)
		a := 1.0
		if r > limit {
			a = max(0, 1-(r-limit)/limit)
		}
		return metrics.Summary{Attainment: a}, nil
	}
}

func TestSearch(t *testing.T) {
	for _, tc := range []struct {
		name      string
		o         sweep.Options
		limit     float64
		wantMax   float64
		wantFail  float64
		wantRates []float64
	}{
		{
			// Passes while r ≤ 5.5 (attainment ≥ 0.9 up to 1.1×5).
			name: "bisect", limit: 5, o: sweep.Options{Rates: []float64{2, 4, 8}, Target: 0.9, Steps: 3},
			wantMax: 5.5, wantFail: 6, wantRates: []float64{2, 4, 8, 6, 5, 5.5},
		},
		{
			name: "grid only", limit: 5, o: sweep.Options{Rates: []float64{8, 2, 4}, Target: 0.9},
			wantMax: 4, wantFail: 8, wantRates: []float64{2, 4, 8},
		},
		{
			name: "stop early", limit: 1, o: sweep.Options{Rates: []float64{1, 2, 4, 8}, Target: 0.9, StopEarly: true},
			wantMax: 1, wantFail: 2, wantRates: []float64{1, 2},
		},
		{
			name: "widen past the grid", limit: 10, o: sweep.Options{Rates: []float64{1, 2}, Target: 0.9, Steps: 4},
			wantMax: 8, wantFail: 12, wantRates: []float64{1, 2, 4, 8, 16, 12},
		},
		{
			name: "all pass, no steps", limit: 10, o: sweep.Options{Rates: []float64{1, 2}, Target: 0.9},
			wantMax: 2, wantFail: math.Inf(1), wantRates: []float64{1, 2},
		},
		{
			name: "lowest fails: search below", limit: 1, o: sweep.Options{Rates: []float64{4}, Target: 0.9, Steps: 3},
			wantMax: 1, wantFail: 1.5, wantRates: []float64{4, 2, 1, 1.5},
		},
		{
			name: "gap reached", limit: 5, o: sweep.Options{Rates: []float64{5, 5.05}, Target: 1, Steps: 5},
			wantMax: 5, wantFail: 5.05, wantRates: []float64{5, 5.05},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rates []float64
			res, err := sweep.Search(context.Background(), tc.o, capacity(tc.limit, &rates))
			if err != nil {
				t.Fatal(err)
			}
			if res.MaxRate != tc.wantMax || res.FailRate != tc.wantFail {
				t.Errorf("max %v fail %v, want %v and %v", res.MaxRate, res.FailRate, tc.wantMax, tc.wantFail)
			}
			if diff := cmp.Diff(tc.wantRates, rates); diff != "" {
				t.Errorf("probed rates (-want +got):\n%s", diff)
			}
			for i := 1; i < len(res.Points); i++ {
				if res.Points[i].Rate < res.Points[i-1].Rate {
					t.Fatalf("points not sorted by rate: %v", res.Points)
				}
			}
		})
	}
}

func TestSearchErrors(t *testing.T) {
	var rates []float64
	p := capacity(1, &rates)
	for _, o := range []sweep.Options{
		{Target: 0.9},
		{Rates: []float64{1}, Target: 0},
		{Rates: []float64{1}, Target: 1.5},
		{Rates: []float64{0}, Target: 0.9},
		{Rates: []float64{math.Inf(1)}, Target: 0.9},
		{Rates: []float64{1}, Target: 0.9, Steps: -1},
	} {
		if _, err := sweep.Search(context.Background(), o, p); !errors.Is(err, sweep.ErrOptions) {
			t.Errorf("%+v: got %v, want ErrOptions", o, err)
		}
	}
	boom := errors.New("boom")
	res, err := sweep.Search(context.Background(), sweep.Options{Rates: []float64{1, 2}, Target: 0.9},
		func(_ context.Context, r float64) (metrics.Summary, error) {
			if r == 2 {
				return metrics.Summary{}, boom
			}
			return metrics.Summary{Attainment: 1}, nil
		})
	if !errors.Is(err, boom) || len(res.Points) != 1 {
		t.Errorf("got %v with %d points, want boom after 1 point", err, len(res.Points))
	}
}
