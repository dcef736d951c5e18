package enginecfg

import (
	"errors"
	"fmt"
	"math"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/perfmodel"
)

// DefaultPayloadScale is the sim engine's default --payload-scale: 1/1024
// of the true KV bytes, which the engine rounds up to the least it keeps
// (8 values per K and V row: 1/128 of Llama-3-8B's KV, 1/640 of
// OPT-13B's), as the loadtest's local deployments use. At 1 a
// CPU generates every byte of the model's true KV: 419 MB for a 512-token
// OPT-13B prompt, seconds of work for a prefill the profile models at
// 72 ms, so the engine falls far behind its model. The true size still
// counts where it matters: KV block sizes, and transfers paced by the
// prefill workers' --pace-gbps.
const DefaultPayloadScale = 1.0 / 1024

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
