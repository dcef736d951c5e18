package enginecfg

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/sim"
	"github.com/pdserve/pdserve/pkg/perfmodel"
)

// DefaultPayloadScale is the sim engine's default --payload-scale: 1/1024
// of the true KV bytes, which the engine rounds up to the least it keeps
// (8 values per K and V row: 1/128 of Llama-3-8B's KV, 1/640 of
// OPT-13B's), as the loadtest's local deployments use. At 1 a
// CPU generates every byte of the model's true KV: 419 MB for a 512-token
// OPT-13B prompt, seconds of work for a prefill the profile models at
// 72 ms, so the engine falls far behind its model. The true size still
// counts where it matters: KV block sizes, and transfers paced by
// --link-gbps.
const DefaultPayloadScale = 1.0 / 1024

// overrunWarnEvery is the least time (engine clock) between two warnings
// of one sim engine falling behind its model.
const overrunWarnEvery = 30 * time.Second

// simLogger receives the sim engines' warnings: the logger of the last
// SetLogger call when the engine was built (nil: none).
var simLogger atomic.Pointer[zap.Logger]

func (o Options) validateSim() []error {
	var errs []error
	if o.Profile == "" {
		errs = append(errs, fmt.Errorf("--profile is required with --engine %s: GPU/MODEL/tpN (coordinator profiles lists them) or a profile JSON file", Sim))
	} else if _, err := perfmodel.Resolve(o.Profile); err != nil {
		errs = append(errs, cliflags.BadFlag("profile", o.Profile, err))
	}
	if !(o.TimeScale > 0) || math.IsInf(o.TimeScale, 0) {
		errs = append(errs, cliflags.BadFlag("time-scale", fmt.Sprint(o.TimeScale), errors.New("must be a finite number > 0")))
	}
	if !(o.PayloadScale > 0 && o.PayloadScale <= 1) {
		errs = append(errs, cliflags.BadFlag("payload-scale", fmt.Sprint(o.PayloadScale), errors.New("must lie in (0, 1]")))
	}
	return errs
}

func (o Options) buildSim() (engine.Engine, error) {
	e, err := sim.New(sim.Options{
		Profile:      o.Profile,
		TimeScale:    o.TimeScale,
		PayloadScale: o.PayloadScale,
		Seed:         o.Seed,
	})
	if err != nil {
		return nil, fmt.Errorf("enginecfg: %w", err)
	}
	if log := simLogger.Load(); log != nil {
		e.OnOverrun(overrunWarner(log, o))
	}
	return e, nil
}

// overrunWarner returns the sim engine's overrun hook: a warning at the
// first step that fell behind the model, then at most one per
// overrunWarnEvery, counting the steps since the last. Not safe for
// concurrent use: one engine's steps call it, one at a time.
func overrunWarner(log *zap.Logger, o Options) func(sim.Overrun) {
	var last time.Time
	var steps int64
	return func(ov sim.Overrun) {
		steps++
		if !last.IsZero() && ov.At.Sub(last) < overrunWarnEvery {
			return
		}
		log.Warn("sim engine fell behind its performance model: step times, TTFT and TPOT are this machine's, not the modeled GPU's; "+
			"lower --payload-scale (generating KV costs CPU), raise --time-scale, or give the process more CPU",
			zap.Duration("step_took", ov.Took), zap.Duration("step_modeled", ov.Scaled), zap.Int64("overrun_steps", steps),
			zap.String("profile", o.Profile), zap.Float64("payload_scale", o.PayloadScale), zap.Float64("time_scale", o.TimeScale))
		last, steps = ov.At, 0
	}
}
