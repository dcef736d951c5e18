package perfmodel

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
)

// Measurement records how `coordinator profile` measured a profile: the
// engine, the hardware it ran on, the time it took and the fit's error.
// Validate checks that the stored errors are those of the profile's own
// coefficients, so that an edited coefficient cannot keep a stale error.
type Measurement struct {
	Tool   string `json:"tool"`   // what measured it, e.g. "coordinator profile"
	Engine string `json:"engine"` // llamacpp, ref or sim
	// EngineModel is what the engine ran: the GGUF file's base name, the
	// ref preset or the sim profile.
	EngineModel string `json:"engine_model"`
	KVType      string `json:"kv_type"` // the engine's KV element type, e.g. f16
	// CtxSize is the engine's KV cache in tokens when it has one
	// (llama.cpp's cells), else 0.
	CtxSize  int  `json:"ctx_size,omitempty"`
	Hardware Host `json:"hardware"`
	// BudgetS is the time allowed (--budget), ElapsedS the time taken,
	// seconds; Repeats the timed repetitions per point (their median is
	// the point's value).
	BudgetS  float64 `json:"budget_s"`
	ElapsedS float64 `json:"elapsed_s"`
	Repeats  int     `json:"repeats"`
	// Grid says what was measured: the largest prompt, decode batch and
	// context, and what the budget left out.
	Grid string   `json:"grid"`
	Fit  FitError `json:"fit"`
}

// Host is the machine a profile was measured on.
type Host struct {
	CPU         string `json:"cpu"`          // /proc/cpuinfo "model name" ("" when unknown)
	LogicalCPUs int    `json:"logical_cpus"` // CPUs of the machine (not of the process's affinity)
	Threads     int    `json:"threads"`      // threads the engine ran with
	// GPU is the accelerator the engine ran on, "" for none.
	GPU         string `json:"gpu,omitempty"`
	MemoryBytes int64  `json:"memory_bytes,omitempty"` // /proc/meminfo MemTotal
	OS          string `json:"os"`
	Arch        string `json:"arch"`
}

// relErrSlack is how far a stored rel_err may lie from the recomputed one
// (the JSON round trip of a float64 is exact; this only absorbs the
// rounding of hand edits).
const relErrSlack = 1e-6

func (p *Profile) checkMeasured() error {
	m := p.Measured
	if m.Tool == "" || m.Engine == "" {
		return errors.New("measured: tool and engine must be named")
	}
	if m.Repeats < 1 || !(m.BudgetS >= 0) || !(m.ElapsedS >= 0) {
		return errors.New("measured: repeats must be ≥ 1, budget_s and elapsed_s ≥ 0")
	}
	for i := range p.Points {
		pt := p.Points[i]
		if pt.Metric != MetricStepMs {
			continue
		}
		if pt.RelErr == nil {
			return fmt.Errorf("measured point %d (%q) has no rel_err", i, pt.Name)
		}
		want := (p.StepSeconds(pt.Batch())*1e3 - pt.Value) / pt.Value
		if math.Abs(want-*pt.RelErr) > relErrSlack {
			return fmt.Errorf("point %d (%q): rel_err %.6g, but the coefficients give %.6g", i, pt.Name, *pt.RelErr, want)
		}
	}
	q := *p
	q.Points = append([]Point(nil), p.Points...)
	f := q.SetFitErrors()
	got := m.Fit
	if got.Points != f.Points || math.Abs(got.TotalRelErr-f.TotalRelErr) > relErrSlack ||
		math.Abs(got.RMSRelErr-f.RMSRelErr) > relErrSlack || math.Abs(got.MaxRelErr-f.MaxRelErr) > relErrSlack {
		return fmt.Errorf("measured fit %+v differs from the points' %+v", got, f)
	}
	return nil
}

// Marshal returns the profile as indented JSON, the format Parse reads.
// Errors: ErrInvalidProfile.
func (p *Profile) Marshal() ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	data, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidProfile, err)
	}
	return append(data, '\n'), nil
}

// WriteFile validates p and writes it to filename as JSON (through a
// temporary file in the same directory, renamed into place). Errors:
// ErrInvalidProfile, the file system's.
func (p *Profile) WriteFile(filename string) error {
	data, err := p.Marshal()
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(filename), ".profile-*.json")
	if err != nil {
		return fmt.Errorf("perfmodel: write profile: %w", err)
	}
	defer os.Remove(f.Name()) // after the rename: a no-op
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("perfmodel: write profile: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("perfmodel: write profile: %w", err)
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return fmt.Errorf("perfmodel: write profile: %w", err)
	}
	if err := os.Rename(f.Name(), filename); err != nil {
		return fmt.Errorf("perfmodel: write profile: %w", err)
	}
	return nil
}
