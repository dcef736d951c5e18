package workload

import (
	"fmt"
	"os"
)

// Options select and shape a workload; they mirror the load generator's
// flags.
type Options struct {
	// Name is the source: random, sharegpt, azure, mooncake or dist.
	Name string
	// Path is the dataset file (sharegpt, azure, mooncake).
	Path string
	// NumPrompts is the number of requests; for traces, ≤ 0 takes every
	// row.
	NumPrompts int
	// Seed makes lengths, content and sampling repeatable.
	Seed  uint64
	Synth Synth

	Random   RandomOptions
	ShareGPT ShareGPTOptions
	Trace    TraceOptions
	// InputDist and OutputDist are the dist source's length distributions.
	InputDist, OutputDist Dist
	// DistPrefixLen is the tokens of a prefix shared by every prompt of
	// the dist source (≥ 0), before its drawn length.
	DistPrefixLen int
}

// Load builds the workload o describes. Errors wrap ErrBadOption,
// ErrMalformed, ErrEmpty or the file's open error.
func Load(o Options) (*Workload, error) {
	if err := o.Synth.Validate(); err != nil {
		return nil, err
	}
	switch o.Name {
	case "random":
		return Random(o.Random, o.NumPrompts, o.Seed, o.Synth)
	case "dist":
		return FromDists(o.InputDist, o.OutputDist, o.DistPrefixLen, o.NumPrompts, o.Seed, o.Synth)
	case "sharegpt", "azure", "mooncake":
	default:
		return nil, fmt.Errorf("%w: dataset %q: want random, sharegpt, azure, mooncake or dist", ErrBadOption, o.Name)
	}
	if o.Path == "" {
		return nil, fmt.Errorf("%w: dataset %s needs --dataset-path", ErrBadOption, o.Name)
	}
	f, err := os.Open(o.Path)
	if err != nil {
		return nil, fmt.Errorf("workload: %w", err)
	}
	defer f.Close()
	switch o.Name {
	case "sharegpt":
		data, err := os.ReadFile(o.Path)
		if err != nil {
			return nil, fmt.Errorf("workload: %w", err)
		}
		convs, err := ParseShareGPT(data)
		if err != nil {
			return nil, err
		}
		return ShareGPT(convs, o.ShareGPT, o.NumPrompts, o.Seed, o.Synth)
	case "azure":
		rows, err := ParseAzure(f)
		if err != nil {
			return nil, err
		}
		return FromTrace("azure", rows, o.Trace, o.NumPrompts, o.Seed, o.Synth)
	default:
		rows, err := ParseMooncake(f)
		if err != nil {
			return nil, err
		}
		return FromTrace("mooncake", rows, o.Trace, o.NumPrompts, o.Seed, o.Synth)
	}
}
