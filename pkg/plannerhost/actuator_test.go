package plannerhost

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type scaleFunc func(ctx context.Context, prefill, decode int) error

func (f scaleFunc) Scale(ctx context.Context, prefill, decode int) error {
	return f(ctx, prefill, decode)
}

// countingActuator counts failed Scale calls, not cancelled ones.
func TestCountingActuator(t *testing.T) {
	errs := prometheus.NewCounter(prometheus.CounterOpts{Name: "errors"})
	var next error
	a := countingActuator{scaleFunc(func(context.Context, int, int) error { return next }), errs}
	for _, next = range []error{nil, errors.New("forbidden"), context.Canceled, errors.New("conflict")} {
		if err := a.Scale(t.Context(), 1, 2); err != next {
			t.Errorf("Scale = %v, want %v passed through", err, next)
		}
	}
	if got := testutil.ToFloat64(errs); got != 2 {
		t.Errorf("%v errors counted, want 2", got)
	}
}
