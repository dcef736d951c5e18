package perfmodel

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// Metric names what a calibration point measures.
type Metric string

// The metrics a point can carry.
const (
	// MetricStepMs is the whole step time of the point's batch, ms.
	MetricStepMs Metric = "step_ms"
	// MetricGEMMMs is the roofline's GEMM component alone (attention,
	// all-reduce and overheads excluded), ms: operator-level profiles such
	// as Vidur's "whole model, attention excluded".
	MetricGEMMMs Metric = "gemm_ms"
	// MetricGEMMTokensPerSec is the batch's tokens divided by the GEMM
	// component, tokens/s (saturated prefill throughput).
	MetricGEMMTokensPerSec Metric = "gemm_tokens_per_s"
	// MetricMaxKVTokens is the KV pool capacity of one worker, tokens
	// (MaxKVTokens); the point carries no batch.
	MetricMaxKVTokens Metric = "max_kv_tokens"
)

// Check says how a point's model value must relate to its source value.
type Check string

// The checks a point can carry.
const (
	// CheckExact: the profile's form is the source's own formula; model
	// and source agree to floating-point rounding (relative 1e-9).
	CheckExact Check = "exact"
	// CheckFit: a measurement the profile is calibrated or validated
	// against; the relative error is at most the profile's Tolerance.
	CheckFit Check = "fit"
	// CheckReference: shown for context, not asserted.
	CheckReference Check = "reference"
)

// ExactTolerance is the relative error CheckExact allows (float rounding).
const ExactTolerance = 1e-9

// Point is one published data point and the batch that reproduces it.
type Point struct {
	Name   string `json:"name"`
	Metric Metric `json:"metric"`
	// The batch: prompt chunks with their cached contexts, and
	// DecodeBatch sequences decoding at DecodeContext tokens each.
	Prefill        []int `json:"prefill,omitempty"`
	PrefillContext []int `json:"prefill_context,omitempty"`
	DecodeBatch    int   `json:"decode_batch,omitempty"`
	DecodeContext  int   `json:"decode_context,omitempty"`
	// Value is the source's figure in the metric's unit.
	Value  float64 `json:"value"`
	Source string  `json:"source"`
	Check  Check   `json:"check"`
	// Spec and TP, when set, evaluate the point on another model shape or
	// tensor-parallel degree with this profile's GPU and factors: how a
	// measurement of a neighbouring model calibrates a roofline profile.
	Spec *ModelShape `json:"spec,omitempty"`
	TP   int         `json:"tp,omitempty"`

	// Measured points (written by `coordinator profile`) also carry:
	// Samples, the timed repetitions whose median is Value; Spread,
	// (slowest − fastest) / median of those; RelErr, the fit's error
	// (model − Value) / Value of this point (0.05 = 5%), which Validate
	// checks against the profile's own coefficients.
	Samples int      `json:"samples,omitempty"`
	Spread  float64  `json:"spread,omitempty"`
	RelErr  *float64 `json:"rel_err,omitempty"`
}

// Batch returns the step the point describes. The slices are new.
func (pt Point) Batch() Batch {
	b := Batch{Prefill: slices.Clone(pt.Prefill), PrefillContext: slices.Clone(pt.PrefillContext)}
	if pt.DecodeBatch > 0 {
		b.Decode = make([]int, pt.DecodeBatch)
		for i := range b.Decode {
			b.Decode[i] = pt.DecodeContext
		}
	}
	return b
}

func (pt Point) validate() error {
	switch pt.Metric {
	case MetricStepMs, MetricGEMMMs, MetricGEMMTokensPerSec, MetricMaxKVTokens:
	default:
		return fmt.Errorf("unknown metric %q", pt.Metric)
	}
	switch pt.Check {
	case CheckExact, CheckFit, CheckReference:
	default:
		return fmt.Errorf("unknown check %q", pt.Check)
	}
	if !(pt.Value > 0) || math.IsInf(pt.Value, 0) {
		return errors.New("value must be positive and finite")
	}
	if pt.DecodeBatch < 0 || pt.TP < 0 || pt.Samples < 0 {
		return errors.New("decode_batch, tp and samples must be ≥ 0")
	}
	if !(pt.Spread >= 0) || math.IsInf(pt.Spread, 0) {
		return errors.New("spread must be finite and ≥ 0")
	}
	if pt.RelErr != nil && (math.IsNaN(*pt.RelErr) || math.IsInf(*pt.RelErr, 0)) {
		return errors.New("rel_err must be finite")
	}
	if pt.Metric == MetricMaxKVTokens {
		if !pt.Batch().empty() {
			return errors.New("a max_kv_tokens point carries no batch")
		}
		return nil
	}
	if b := pt.Batch(); b.empty() {
		return errors.New("empty batch")
	} else if err := b.Validate(); err != nil {
		return err
	}
	return nil
}

// Evaluate returns the model's value for pt in pt.Metric's unit. Errors: a
// GEMM metric on a profile without roofline factors, or an override that
// makes the profile invalid (both wrapped in ErrInvalidProfile).
func (p *Profile) Evaluate(pt Point) (float64, error) {
	q := p
	if pt.Spec != nil || pt.TP > 0 {
		c := *p
		if pt.Spec != nil {
			c.Spec = *pt.Spec
		}
		if pt.TP > 0 {
			c.TP = pt.TP
		}
		c.KVBytes = 0 // measured on the profile's own model
		c.Name = c.WantName()
		c.Points, c.Measured = nil, nil
		if err := c.Validate(); err != nil {
			return 0, err
		}
		q = &c
	}
	b := pt.Batch()
	switch pt.Metric {
	case MetricStepMs:
		return q.StepSeconds(b) * 1e3, nil
	case MetricMaxKVTokens:
		return float64(q.MaxKVTokens()), nil
	}
	if q.Roofline == nil {
		return 0, fmt.Errorf("%w %q: metric %s needs roofline factors", ErrInvalidProfile, p.Name, pt.Metric)
	}
	gemm := q.rooflineParts(b).gemm
	if pt.Metric == MetricGEMMMs {
		return gemm * 1e3, nil
	}
	var tokens int
	for _, l := range b.Prefill {
		tokens += l
	}
	return float64(tokens+len(b.Decode)) / gemm, nil
}

// CalibrationRow compares one point's source value with the model.
type CalibrationRow struct {
	Profile string
	Point   string
	Metric  Metric
	Source  float64 // the source's value, metric units
	Model   float64 // the model's value, metric units
	RelErr  float64 // (Model − Source) / Source
	Check   Check
	// Limit is the largest |RelErr| the check allows (ExactTolerance,
	// the profile's Tolerance, or +Inf for CheckReference).
	Limit float64
}

// OK reports whether the row meets its check.
func (r CalibrationRow) OK() bool { return math.Abs(r.RelErr) <= r.Limit }

// Calibrate evaluates every point of p. Errors as for Evaluate.
func (p *Profile) Calibrate() ([]CalibrationRow, error) {
	rows := make([]CalibrationRow, 0, len(p.Points))
	for _, pt := range p.Points {
		v, err := p.Evaluate(pt)
		if err != nil {
			return nil, fmt.Errorf("point %q: %w", pt.Name, err)
		}
		limit := math.Inf(1)
		switch pt.Check {
		case CheckExact:
			limit = ExactTolerance
		case CheckFit:
			limit = p.Tolerance
		}
		rows = append(rows, CalibrationRow{
			Profile: p.Name, Point: pt.Name, Metric: pt.Metric,
			Source: pt.Value, Model: v, RelErr: (v - pt.Value) / pt.Value,
			Check: pt.Check, Limit: limit,
		})
	}
	return rows, nil
}

// WriteCalibrationReport writes, for every embedded profile, a table of its
// data points: source value, model value, relative error and the check with
// its verdict. It returns the first load, evaluation or write error; rows
// that miss their check are marked FAIL but are not an error.
func WriteCalibrationReport(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROFILE\tPOINT\tMETRIC\tSOURCE\tMODEL\tREL.ERR\tCHECK")
	for _, name := range Names() {
		p, err := Load(name)
		if err != nil {
			return err
		}
		rows, err := p.Calibrate()
		if err != nil {
			return fmt.Errorf("perfmodel: calibrate %s: %w", name, err)
		}
		for _, r := range rows {
			verdict := "ok"
			if !r.OK() {
				verdict = "FAIL"
			}
			check := string(r.Check)
			switch r.Check {
			case CheckFit:
				check = fmt.Sprintf("fit ≤%.0f%% %s", 100*r.Limit, verdict)
			case CheckExact:
				check = "exact " + verdict
			}
			relErr := 100 * r.RelErr
			if math.Abs(relErr) < 0.005 {
				relErr = 0 // no "-0.00%" from rounding noise
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.6g\t%.6g\t%+.2f%%\t%s\n",
				r.Profile, r.Point, r.Metric, r.Source, r.Model, relErr, check)
		}
	}
	return tw.Flush()
}

// WriteProfiles writes a table of the embedded profiles: name, form, KV
// bytes per token, weights per GPU, KV pool capacity in tokens, a prefill
// and a decode step time, and the source. It returns the first load or
// write error.
func WriteProfiles(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROFILE\tFORM\tKV/TOKEN\tWEIGHTS/GPU\tMAX KV TOKENS\tPREFILL 1x2048\tDECODE 32x1024\tSOURCE")
	for _, name := range Names() {
		p, err := Load(name)
		if err != nil {
			return err
		}
		dec := make([]int, 32)
		for i := range dec {
			dec[i] = 1024
		}
		fmt.Fprintf(tw, "%s\t%s\t%d B\t%.1f GB\t%d\t%v\t%v\t%s\n",
			p.Name, p.Form, p.KVBytesPerToken(), p.WeightBytesPerGPU()/1e9, p.MaxKVTokens(),
			p.PrefillTime([]int{2048}).Round(1e5), p.DecodeTime(dec).Round(1e5), citation(p.Source))
	}
	return tw.Flush()
}

// citation returns the source's first clause (up to the first ';').
func citation(source string) string {
	short, _, _ := strings.Cut(source, ";")
	return short
}
