package enginecfg

import (
	"errors"
	"fmt"
	"math"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/sim"
	"github.com/pdserve/pdserve/pkg/perfmodel"
)

func (o Options) validateSim() []error {
	var errs []error
	if o.Profile == "" {
		errs = append(errs, errors.New("profile is required with engine sim"))
	} else if _, err := perfmodel.Resolve(o.Profile); err != nil {
		errs = append(errs, fmt.Errorf("profile: %w", err))
	}
	if !(o.TimeScale > 0) || math.IsInf(o.TimeScale, 0) {
		errs = append(errs, fmt.Errorf("time-scale %v must be a finite number > 0", o.TimeScale))
	}
	if !(o.PayloadScale > 0 && o.PayloadScale <= 1) {
		errs = append(errs, fmt.Errorf("payload-scale %v must lie in (0, 1]", o.PayloadScale))
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
	return e, nil
}
