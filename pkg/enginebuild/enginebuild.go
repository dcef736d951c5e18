package enginebuild

import (
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/llamacpp"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/engine/sim"
	"github.com/pdserve/pdserve/pkg/enginecfg"
)

// Build returns a new engine for o, after o.Validate. The caller owns it:
// when it has a Close method (see Close), call it once the engine is no
// longer used. Errors: o.Validate's, the engine's.
func Build(o enginecfg.Options) (engine.Engine, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	switch o.Engine {
	case enginecfg.Ref:
		e, err := ref.New(ref.Options{Preset: o.Preset, Seed: o.Seed, Threads: o.Threads})
		if err != nil {
			return nil, fmt.Errorf("enginebuild: %w", err)
		}
		return e, nil
	case enginecfg.Llama:
		e, err := llamacpp.New(o.LlamaOptions())
		if err != nil {
			return nil, fmt.Errorf("enginebuild: %w", err)
		}
		return e, nil
	default:
		return buildSim(o)
	}
}

// Close releases an engine built by Build, if it holds resources (the ref
// engine's worker goroutines, llama.cpp's model and context).
func Close(e engine.Engine) {
	if c, ok := e.(interface{ Close() }); ok {
		c.Close()
	}
}

// SetLogger routes the log of the engines' native libraries (llama.cpp,
// at debug level but for its errors) to l (enginecfg.SetLogger), and the
// warnings of sim engines built after the call (a step that fell behind
// the model). Both are process-wide: the last logger set receives them.
func SetLogger(l *zap.Logger) {
	enginecfg.SetLogger(l)
	simLogger.Store(l)
}

// overrunWarnEvery is the least time (engine clock) between two warnings
// of one sim engine falling behind its model.
const overrunWarnEvery = 30 * time.Second

// simLogger receives the sim engines' warnings: the logger of the last
// SetLogger call when the engine was built (nil: none).
var simLogger atomic.Pointer[zap.Logger]

func buildSim(o enginecfg.Options) (engine.Engine, error) {
	e, err := sim.New(sim.Options{
		Profile:      o.Profile,
		TimeScale:    o.TimeScale,
		PayloadScale: o.PayloadScale,
		Seed:         o.Seed,
	})
	if err != nil {
		return nil, fmt.Errorf("enginebuild: %w", err)
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
func overrunWarner(log *zap.Logger, o enginecfg.Options) func(sim.Overrun) {
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
