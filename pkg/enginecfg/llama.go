package enginecfg

import (
	"errors"
	"fmt"
	"os"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/llamacpp"
)

func (o Options) validateLlama() []error {
	var errs []error
	if o.Model == "" {
		errs = append(errs, fmt.Errorf("--model is required with --engine %s: the GGUF file to serve", Llama))
	} else if fi, err := os.Stat(o.Model); err != nil {
		errs = append(errs, cliflags.BadFlag("model", o.Model, err))
	} else if fi.IsDir() {
		errs = append(errs, cliflags.BadFlag("model", o.Model, errors.New("is a directory, not a GGUF file")))
	}
	if _, err := o.llamaKVType(); err != nil {
		errs = append(errs, err)
	}
	if o.CtxSize < 0 {
		errs = append(errs, badInt("ctx-size", o.CtxSize, "must not be negative"))
	}
	if o.MaxSeqs < 1 || o.MaxSeqs > 256 {
		errs = append(errs, badInt("max-seqs", o.MaxSeqs, "must lie in [1, 256]"))
	}
	if o.Threads < 0 {
		errs = append(errs, badInt("engine-threads", o.Threads, "must not be negative"))
	}
	if o.Device != "" {
		if _, err := llamacpp.DeviceMode(o.Device); err != nil {
			errs = append(errs, cliflags.BadFlag("llama-device", o.Device, fmt.Errorf("must be %s, %s or %s", llamacpp.DeviceAuto, llamacpp.DeviceGPU, llamacpp.DeviceCPU)))
		}
	} else if _, err := llamacpp.DeviceMode(""); err != nil {
		errs = append(errs, err)
	}
	return errs
}

func (o Options) llamaKVType() (engine.DType, error) {
	switch o.KVType {
	case "", "f16":
		return engine.F16, nil
	case "q8_0":
		return engine.Q8_0, nil
	}
	return 0, cliflags.BadFlag("kv-type", o.KVType, errors.New("must be f16 or q8_0"))
}

// LlamaOptions returns the options of llama.cpp's engine (llamacpp.New)
// these settings give; call it on valid options.
func (o Options) LlamaOptions() llamacpp.Options {
	kv, _ := o.llamaKVType()
	return llamacpp.Options{
		LibDir: o.LlamaLib, Model: o.Model, GPULayers: o.GPULayers, CtxSize: o.CtxSize,
		Threads: o.Threads, KVType: kv, MaxSeqs: o.MaxSeqs, NoRepack: o.NoRepack,
		CPUVariant: o.CPUVariant, Device: o.Device,
	}
}

func (o Options) llamaLogFields() []zap.Field {
	return []zap.Field{zap.String("engine", o.Engine), zap.String("model", o.Model), zap.String("llama_lib", llamacpp.LibDir(o.LlamaLib)),
		zap.Int("gpu_layers", o.GPULayers), zap.Int("ctx_size", o.CtxSize), zap.String("kv_type", o.KVType),
		zap.Int("max_seqs", o.MaxSeqs), zap.Int("engine_threads", o.Threads), zap.Bool("no_repack", o.NoRepack), zap.String("llama_cpu_variant", o.CPUVariant),
		zap.String("llama_device", o.device())}
}

// Tokenizer returns the tokenizer a coordinator uses for these settings
// without running the engine: the model's own vocabulary (loaded alone,
// without weights) for llamacpp, nil for the engines whose tokenizer is
// the byte-level one. Close the returned closer when done (nil: nothing
// to close).
func (o Options) Tokenizer() (engine.Tokenizer, func(), error) {
	if o.Engine != Llama {
		return nil, nil, nil
	}
	if err := o.Validate(); err != nil {
		return nil, nil, err
	}
	m, err := llamacpp.LoadModel(o.Model, llamacpp.LoadOptions{LibDir: o.LlamaLib, VocabOnly: true, CPUVariant: o.CPUVariant, Device: o.Device})
	if err != nil {
		return nil, nil, fmt.Errorf("enginecfg: tokenizer: %w", err)
	}
	return m.Tokenizer(), m.Close, nil
}

// SetLogger routes the log of the engines' native library (llama.cpp, at
// debug level but for its errors) to l, for the tokenizer as for the
// engine. The library's log is process-wide: the last logger set receives
// it. enginebuild.SetLogger also routes the sim engines' warnings.
func SetLogger(l *zap.Logger) {
	llamacpp.SetLogger(l)
}

// device is the effective device policy (the flag, else the environment's,
// else auto), or the flag as given when it is invalid.
func (o Options) device() string {
	if d, err := llamacpp.DeviceMode(o.Device); err == nil {
		return d
	}
	return o.Device
}
