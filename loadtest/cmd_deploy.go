package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/pdserve/pdserve/loadtest/deploy"
	"github.com/pdserve/pdserve/loadtest/report"
	"github.com/pdserve/pdserve/pkg/enginecfg"
)

// deployFlags describe local deployments (compare, regress).
type deployFlags struct {
	Engine, Profile, Preset string
	PayloadScale            float64
	GPUs                    int
	Split                   string
	Codec                   string
	LinkGbps                float64
	Policy                  string
	ChunkTokens             int
	MaxBatchTokens          int
	MaxBatch                int
	KVBlocks                int
	QueueLimit              int
	PolicyFile              string
	LogFile                 string
	// Unit is what --gpus counts in reports ("" : see unit).
	Unit string
	// llamacpp deployments.
	ModelFile, LlamaLib string
	CPUs                string
	CtxSize, MaxSeqs    int
	NoRepack            bool
}

func defaultDeployFlags() *deployFlags {
	return &deployFlags{Engine: "sim", Profile: "a100-80g/opt-13b/tp1", Preset: "tiny", PayloadScale: 1.0 / 1024, GPUs: 3, Split: "2:1", Codec: "none", LinkGbps: 100, Policy: "prefill"}
}

func (d *deployFlags) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&d.Engine, "engine", d.Engine, "local deployments: sim (performance model), ref (reference CPU engine) or llamacpp (a GGUF model on llama.cpp, each worker a process pinned to its cores)")
	fs.StringVar(&d.Profile, "profile", d.Profile, "local sim deployments: GPU/MODEL/tpN profile")
	fs.StringVar(&d.Preset, "preset", d.Preset, "local ref deployments: model preset")
	fs.Float64Var(&d.PayloadScale, "payload-scale", d.PayloadScale, "local sim deployments: fraction of the true KV bytes actually moved, in (0, 1]; transfers are still paced for the true size")
	fs.IntVar(&d.GPUs, "gpus", d.GPUs, "GPUs of the deployment (local: workers × tp; for rates per GPU)")
	fs.StringVar(&d.Split, "pd-split", d.Split, "local disaggregated deployment: prefill:decode workers, e.g. 2:1 (P+D workers × tp = --gpus); compare also takes auto: the split the planner predicts serves the workload best")
	fs.StringVar(&d.Codec, "codec", d.Codec, "local disaggregated deployment: KV codec (none, s2, zstd, bf16, fp8, int8)")
	fs.Float64Var(&d.LinkGbps, "link-gbps", d.LinkGbps, "local disaggregated deployment: KV link bandwidth in Gbit/s (0: unpaced)")
	fs.StringVar(&d.Policy, "first-token-policy", d.Policy, "local disaggregated deployment: prefill (KV transfer in the first gap) or decode (in TTFT)")
	fs.IntVar(&d.ChunkTokens, "chunk-tokens", d.ChunkTokens, "local deployments: chunked-prefill chunk per sequence (0: worker default, 512)")
	fs.IntVar(&d.MaxBatchTokens, "max-batch-tokens", d.MaxBatchTokens, "local deployments: tokens per step (0: worker default, 2048)")
	fs.IntVar(&d.MaxBatch, "max-batch", d.MaxBatch, "local deployments: sequences per decode step (0: worker default)")
	fs.IntVar(&d.KVBlocks, "kv-blocks", d.KVBlocks, "local deployments: KV blocks per decode/colocated worker (0: worker default)")
	fs.IntVar(&d.QueueLimit, "queue-limit", d.QueueLimit, "local deployments: coordinator admission limit (0: default)")
	fs.StringVar(&d.PolicyFile, "coordinator-config", d.PolicyFile, "local deployments: the coordinator's policy YAML (its --policy: routing weights and picker, limits; default: the default policy)")
	fs.StringVar(&d.LogFile, "deploy-log", d.LogFile, "local deployments: write their logs to this file (default: discard)")
	fs.StringVar(&d.ModelFile, "model-file", d.ModelFile, "local llamacpp deployments: the GGUF model file (--model stays the model name requests carry)")
	fs.StringVar(&d.LlamaLib, "llama-lib", d.LlamaLib, "local llamacpp deployments: directory of llama.cpp's libraries (default: the engine's)")
	fs.StringVar(&d.CPUs, "cpus", d.CPUs, "local llamacpp deployments: the cores, e.g. 0,1 or 0-3 (default: 0 to --gpus−1); the disaggregated workers split them evenly, prefill first, each pinned to its share; the colocated side runs one worker pinned to all; one engine thread per core")
	fs.IntVar(&d.CtxSize, "ctx-size", d.CtxSize, "local llamacpp deployments: KV cache tokens per worker (0: the model's context)")
	fs.IntVar(&d.MaxSeqs, "max-seqs", d.MaxSeqs, "local llamacpp deployments: sequences per worker (0: the engine default)")
	fs.BoolVar(&d.NoRepack, "no-repack", d.NoRepack, "local llamacpp deployments: keep weights in their file layout (llama-server --no-repack)")
	fs.StringVar(&d.Unit, "unit", d.Unit, "what --gpus counts in reports and plots: GPU or core (default: core for local llamacpp deployments, else GPU)")
}

// spec returns the Spec of a local deployment in mode.
func (d *deployFlags) spec(mode string, timeScale float64) (deploy.Spec, error) {
	s := deploy.Spec{
		Mode: mode, Engine: d.Engine, Profile: d.Profile, Preset: d.Preset, TimeScale: timeScale, PayloadScale: d.PayloadScale,
		Codec: d.Codec, LinkGbps: d.LinkGbps, FirstTokenPolicy: d.Policy,
		ChunkTokens: d.ChunkTokens, MaxBatchTokens: d.MaxBatchTokens, MaxBatch: d.MaxBatch,
		KVBlocks: d.KVBlocks, QueueLimit: d.QueueLimit, PolicyFile: d.PolicyFile,
	}
	if d.Engine == enginecfg.Llama {
		return d.llamaSpec(s)
	}
	tp, err := s.TP()
	if err != nil {
		return s, err
	}
	if d.GPUs < 1 || d.GPUs%tp != 0 {
		return s, fmt.Errorf("%w: --gpus %d: want a positive multiple of the profile's tp %d", errUsage, d.GPUs, tp)
	}
	workers := d.GPUs / tp
	switch mode {
	case deploy.Colocated:
		s.DecodeWorkers = workers
	case deploy.Disaggregated:
		np, nd, err := d.split()
		if err != nil {
			return s, err
		}
		if np+nd != workers {
			return s, fmt.Errorf("%w: --pd-split %s is %d workers, but --gpus %d at tp %d makes %d", errUsage, d.Split, np+nd, d.GPUs, tp, workers)
		}
		s.PrefillWorkers, s.DecodeWorkers = np, nd
	default:
		return s, fmt.Errorf("%w: mode %q: want disaggregated or colocated", errUsage, mode)
	}
	return s, nil
}

// split parses --pd-split: prefill and decode workers, both at least 1.
func (d *deployFlags) split() (np, nd int, err error) {
	p, dd, ok := strings.Cut(d.Split, ":")
	np, err1 := strconv.Atoi(p)
	nd, err2 := strconv.Atoi(dd)
	if !ok || err1 != nil || err2 != nil || np < 1 || nd < 1 {
		return 0, 0, fmt.Errorf("%w: --pd-split %q: want P:D with P, D ≥ 1", errUsage, d.Split)
	}
	return np, nd, nil
}

// startLocal starts a local deployment in mode when mode is not empty and
// returns its URL, what it runs, and a stop function (a no-op when mode is
// empty).
func (d *deployFlags) startLocal(ctx context.Context, mode string, timeScale float64, stderr io.Writer) (string, report.Object, func(), error) {
	if mode == "" {
		return "", nil, func() {}, nil
	}
	spec, err := d.spec(mode, timeScale)
	if err != nil {
		return "", nil, nil, err
	}
	log, closeLog, err := d.logger()
	if err != nil {
		return "", nil, nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	fmt.Fprintf(stderr, "starting a local %s deployment (%d GPUs)\n", mode, d.GPUs)
	l, err := deploy.Start(ctx, spec, log)
	if err != nil {
		closeLog()
		return "", nil, nil, err
	}
	stop := func() {
		if err := l.Close(context.Background()); err != nil {
			fmt.Fprintf(stderr, "warning: stopping the local deployment: %v\n", err)
		}
		closeLog()
	}
	return l.URL(), spec.Facts(), stop, nil
}

// logger returns the deployments' logger and its closer.
func (d *deployFlags) logger() (*zap.Logger, func(), error) {
	if d.LogFile == "" {
		return zap.NewNop(), func() {}, nil
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(zapcore.InfoLevel)
	cfg.OutputPaths = []string{d.LogFile}
	cfg.ErrorOutputPaths = []string{d.LogFile}
	log, err := cfg.Build()
	if err != nil {
		return nil, nil, fmt.Errorf("--deploy-log: %w", err)
	}
	return log, func() { _ = log.Sync() }, nil
}

// checkUnit reports a --unit other than GPU or core.
func (d *deployFlags) checkUnit() error {
	switch d.Unit {
	case "", "GPU", "core":
		return nil
	}
	return fmt.Errorf("%w: --unit %q: want GPU or core", errUsage, d.Unit)
}

// unit returns what --gpus counts in reports: --unit when given, else
// "core" for a local llama.cpp deployment (pinned to CPU cores), else
// "GPU".
func (d *deployFlags) unit(local bool) string {
	if d.Unit != "" {
		return d.Unit
	}
	if local && d.Engine == enginecfg.Llama {
		return "core"
	}
	return "GPU"
}

// parseCPUs parses a core list: "0,1", "0-3", "0,2-3".
func parseCPUs(spec string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || a < 0 || b < a || b-a > 4096 {
			return nil, fmt.Errorf("%w: --cpus %q: want cores like 0,1 or 0-3", errUsage, spec)
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	return out, nil
}

// llamaSpec completes s for a local llamacpp deployment: --gpus cores
// (--cpus, or 0 to --gpus−1), split P:D on the disaggregated side, one
// colocated worker on all of them.
func (d *deployFlags) llamaSpec(s deploy.Spec) (deploy.Spec, error) {
	s.Model, s.LlamaLib, s.CtxSize, s.MaxSeqs, s.NoRepack = d.ModelFile, d.LlamaLib, d.CtxSize, d.MaxSeqs, d.NoRepack
	if d.ModelFile == "" {
		return s, fmt.Errorf("%w: --engine llamacpp needs --model-file FILE.gguf", errUsage)
	}
	if d.CPUs != "" {
		cpus, err := parseCPUs(d.CPUs)
		if err != nil {
			return s, err
		}
		s.CPUs = cpus
	} else {
		for c := range d.GPUs {
			s.CPUs = append(s.CPUs, c)
		}
	}
	if len(s.CPUs) != d.GPUs || d.GPUs < 1 {
		return s, fmt.Errorf("%w: --cpus lists %d cores but --gpus is %d: give both the same count", errUsage, len(s.CPUs), d.GPUs)
	}
	switch s.Mode {
	case deploy.Colocated:
		s.DecodeWorkers = 1
	case deploy.Disaggregated:
		np, nd, err := d.split()
		if err != nil {
			return s, err
		}
		if len(s.CPUs)%(np+nd) != 0 {
			return s, fmt.Errorf("%w: --pd-split %s: %d workers cannot share %d cores evenly", errUsage, d.Split, np+nd, len(s.CPUs))
		}
		s.PrefillWorkers, s.DecodeWorkers = np, nd
	default:
		return s, fmt.Errorf("%w: mode %q: want disaggregated or colocated", errUsage, s.Mode)
	}
	return s, nil
}
