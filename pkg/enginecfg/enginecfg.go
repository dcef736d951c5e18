package enginecfg

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/engine/llamacpp"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/perfmodel"
)

// Engine kinds.
const (
	Ref   = "ref"      // reference CPU transformer with synthetic weights
	Sim   = "sim"      // performance-model engine
	Llama = "llamacpp" // GGUF models on llama.cpp
)

// Options select and configure an engine. Start from DefaultOptions.
type Options struct {
	// Engine is Ref or Sim.
	Engine string
	// Preset is the ref engine's synthetic model ("tiny", "small").
	Preset string
	// Seed selects the ref engine's synthetic weights and the sim engine's
	// synthetic KV values; every worker of a deployment must use the same.
	Seed uint64
	// Threads is the ref engine's matrix-work goroutines (0: GOMAXPROCS).
	Threads int
	// Profile names the sim engine's GPU/model profile, "GPU/MODEL/tpN".
	Profile string
	// TimeScale multiplies the sim engine's step times (1: real time; 0.1:
	// ten times faster). > 0.
	TimeScale float64
	// PayloadScale is the fraction of the true KV bytes the sim engine
	// hands out, in (0, 1] (default DefaultPayloadScale); transfers are
	// still paced for the true size. Every worker of a deployment must use
	// the same.
	PayloadScale float64

	// Model is the llamacpp engine's GGUF file.
	Model string
	// LlamaLib is the directory of llama.cpp's shared libraries ("":
	// $PDSERVE_LLAMA_LIB, else third_party/llama/lib).
	LlamaLib string
	// GPULayers is the number of layers llamacpp offloads to GPUs (-1: all).
	GPULayers int
	// CtxSize is llamacpp's KV cache in tokens, shared by all sequences
	// (0: the model's training context).
	CtxSize int
	// KVType is llamacpp's KV cache type, "f16" or "q8_0".
	KVType string
	// MaxSeqs is the number of sequences a llamacpp engine holds at once.
	MaxSeqs int
	// NoRepack keeps llamacpp's weights in their file layout (no CPU
	// repacking), as llama-server's --no-repack does.
	NoRepack bool
	// CPUVariant is the CPU backend variant of llama.cpp to load
	// (libggml-cpu-NAME.so; "": the best this processor runs).
	CPUVariant string
	// Device is llamacpp's device policy: auto, gpu or cpu ("":
	// $PDSERVE_LLAMA_DEVICE, else auto); see llamacpp.DeviceMode.
	Device string
}

// DefaultOptions returns the flag defaults: the tiny ref preset, seed 1;
// for the sim engine real time and DefaultPayloadScale.
func DefaultOptions() Options {
	return Options{Engine: Ref, Preset: "tiny", Seed: 1, TimeScale: 1, PayloadScale: DefaultPayloadScale, GPULayers: -1, KVType: "f16", MaxSeqs: 64}
}

// AddFlags registers --engine, --preset, --seed, --engine-threads,
// --profile, --time-scale, --payload-scale, --model, --llama-lib,
// --gpu-layers, --ctx-size, --kv-type, --max-seqs, --no-repack,
// --llama-cpu-variant and --llama-device on fs, with o's values as
// defaults.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Engine, "engine", o.Engine, "engine: ref (reference CPU transformer, synthetic weights), sim (performance model) or llamacpp (GGUF models on llama.cpp)")
	fs.StringVar(&o.Preset, "preset", o.Preset, fmt.Sprintf("ref engine model preset: one of %v", ref.Presets()))
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "ref engine weight seed; all workers of a deployment must share it")
	fs.IntVar(&o.Threads, "engine-threads", o.Threads, "ref engine goroutines for matrix work, llamacpp threads (0: every CPU)")
	fs.StringVar(&o.Profile, "profile", o.Profile, fmt.Sprintf("sim engine profile, GPU/MODEL/tpN (one of %s) or a profile JSON file", strings.Join(perfmodel.Names(), ", ")))
	fs.Float64Var(&o.TimeScale, "time-scale", o.TimeScale, "sim engine step-time multiplier (1 = real time, 0.1 = ten times faster)")
	fs.Float64Var(&o.PayloadScale, "payload-scale", o.PayloadScale, "sim engine: fraction of the true KV bytes generated and moved, in (0, 1] (the default, 1/1024, keeps a CPU from falling behind the modeled GPU; block sizes and transfers paced by --pace-gbps count the true size); every worker of a deployment must use the same")
	fs.StringVar(&o.Model, "model", o.Model, "llamacpp engine: the GGUF model file")
	fs.StringVar(&o.LlamaLib, "llama-lib", o.LlamaLib, "llamacpp engine: directory of llama.cpp's shared libraries (default $"+llamacpp.EnvLib+", else "+llamacpp.DefaultLibDir+")")
	fs.IntVar(&o.GPULayers, "gpu-layers", o.GPULayers, "llamacpp engine: layers offloaded to the GPU (-1: all; 0: none; a CPU build of llama.cpp ignores it)")
	fs.IntVar(&o.CtxSize, "ctx-size", o.CtxSize, "llamacpp engine: KV cache in tokens, shared by all sequences (0: the model's training context)")
	fs.StringVar(&o.KVType, "kv-type", o.KVType, "llamacpp engine: KV cache type, f16 or q8_0")
	fs.IntVar(&o.MaxSeqs, "max-seqs", o.MaxSeqs, "llamacpp engine: sequences held at once, in [1, 256]")
	fs.BoolVar(&o.NoRepack, "no-repack", o.NoRepack, "llamacpp engine: keep weights in their file layout instead of repacking them for llama.cpp's faster CPU kernels (as llama-server --no-repack)")
	fs.StringVar(&o.CPUVariant, "llama-cpu-variant", o.CPUVariant, "llamacpp engine: CPU backend variant to load, libggml-cpu-NAME.so of --llama-lib (haswell, skylakex, zen4, x64, …; default: the best this processor runs). The variants round differently: give workers on processors of different families one they all run, for the same logits everywhere")
	fs.StringVar(&o.Device, "llama-device", o.Device, "llamacpp engine: auto (the GPUs llama.cpp finds, else the CPU), gpu (refuse to start unless llama.cpp finds a GPU: the CUDA image's default) or cpu (load no GPU backend, offload nothing); default $"+llamacpp.EnvDevice+", else auto")
}

// Validate reports every invalid field in one error: "enginecfg: invalid
// options: " over one error per field, each naming its flag
// (cliflags.FlagError: "--model /m.gguf: no such file or directory").
// errors.Is and errors.As see the causes (fs.ErrNotExist, …).
func (o Options) Validate() error {
	var errs []error
	switch o.Engine {
	case Ref:
		if !slices.Contains(ref.Presets(), o.Preset) {
			errs = append(errs, cliflags.BadFlag("preset", o.Preset, fmt.Errorf("must be one of %s", strings.Join(ref.Presets(), ", "))))
		}
		if o.Threads < 0 {
			errs = append(errs, badInt("engine-threads", o.Threads, "must not be negative"))
		}
	case Sim:
		errs = append(errs, o.validateSim()...)
	case Llama:
		errs = append(errs, o.validateLlama()...)
	default:
		errs = append(errs, cliflags.BadFlag("engine", o.Engine, fmt.Errorf("must be %s, %s or %s", Ref, Sim, Llama)))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("enginecfg: invalid options: %w", err)
	}
	return nil
}

// badInt is the error of an integer flag's value.
func badInt(flag string, v int, why string) error {
	return cliflags.BadFlag(flag, strconv.Itoa(v), errors.New(why))
}

// LogFields returns the settings as zap fields.
func (o Options) LogFields() []zap.Field {
	if o.Engine == Llama {
		return o.llamaLogFields()
	}
	if o.Engine == Sim {
		return []zap.Field{zap.String("engine", o.Engine), zap.String("profile", o.Profile), zap.Float64("time_scale", o.TimeScale),
			zap.Float64("payload_scale", o.PayloadScale), zap.Uint64("seed", o.Seed)}
	}
	return []zap.Field{zap.String("engine", o.Engine), zap.String("preset", o.Preset), zap.Uint64("seed", o.Seed), zap.Int("engine_threads", o.Threads)}
}
