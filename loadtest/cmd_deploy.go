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
	LogFile                 string
	// Unit is what --gpus counts in reports ("" : see unit).
	Unit string
}

func defaultDeployFlags() *deployFlags {
	return &deployFlags{Engine: "sim", Profile: "a100-80g/opt-13b/tp1", Preset: "tiny", PayloadScale: 1.0 / 1024, GPUs: 3, Split: "2:1", Codec: "none", LinkGbps: 100, Policy: "prefill"}
}

func (d *deployFlags) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&d.Engine, "engine", d.Engine, "local deployments: sim (performance model) or ref (reference CPU engine)")
	fs.StringVar(&d.Profile, "profile", d.Profile, "local sim deployments: GPU/MODEL/tpN profile")
	fs.StringVar(&d.Preset, "preset", d.Preset, "local ref deployments: model preset")
	fs.Float64Var(&d.PayloadScale, "payload-scale", d.PayloadScale, "local sim deployments: fraction of the true KV bytes actually moved, in (0, 1]; transfers are still paced for the true size")
	fs.IntVar(&d.GPUs, "gpus", d.GPUs, "GPUs of the deployment (local: workers × tp; for rates per GPU)")
	fs.StringVar(&d.Split, "pd-split", d.Split, "local disaggregated deployment: prefill:decode workers, e.g. 2:1 (P+D workers × tp = --gpus)")
	fs.StringVar(&d.Codec, "codec", d.Codec, "local disaggregated deployment: KV codec (none, s2, zstd, bf16, fp8, int8)")
	fs.Float64Var(&d.LinkGbps, "link-gbps", d.LinkGbps, "local disaggregated deployment: KV link bandwidth in Gbit/s (0: unpaced)")
	fs.StringVar(&d.Policy, "first-token-policy", d.Policy, "local disaggregated deployment: prefill (KV transfer in the first gap) or decode (in TTFT)")
	fs.IntVar(&d.ChunkTokens, "chunk-tokens", d.ChunkTokens, "local deployments: chunked-prefill chunk per sequence (0: worker default, 512)")
	fs.IntVar(&d.MaxBatchTokens, "max-batch-tokens", d.MaxBatchTokens, "local deployments: tokens per step (0: worker default, 2048)")
	fs.IntVar(&d.MaxBatch, "max-batch", d.MaxBatch, "local deployments: sequences per decode step (0: worker default)")
	fs.IntVar(&d.KVBlocks, "kv-blocks", d.KVBlocks, "local deployments: KV blocks per decode/colocated worker (0: worker default)")
	fs.IntVar(&d.QueueLimit, "queue-limit", d.QueueLimit, "local deployments: coordinator admission limit (0: default)")
	fs.StringVar(&d.LogFile, "deploy-log", d.LogFile, "local deployments: write their logs to this file (default: discard)")
	fs.StringVar(&d.Unit, "unit", d.Unit, "what --gpus counts in reports and plots: GPU or core (default: core for local llamacpp deployments, else GPU)")
}

// spec returns the Spec of a local deployment in mode.
func (d *deployFlags) spec(mode string, timeScale float64) (deploy.Spec, error) {
	s := deploy.Spec{
		Mode: mode, Engine: d.Engine, Profile: d.Profile, Preset: d.Preset, TimeScale: timeScale, PayloadScale: d.PayloadScale,
		Codec: d.Codec, LinkGbps: d.LinkGbps, FirstTokenPolicy: d.Policy,
		ChunkTokens: d.ChunkTokens, MaxBatchTokens: d.MaxBatchTokens, MaxBatch: d.MaxBatch,
		KVBlocks: d.KVBlocks, QueueLimit: d.QueueLimit,
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
		p, dd, ok := strings.Cut(d.Split, ":")
		np, err1 := strconv.Atoi(p)
		nd, err2 := strconv.Atoi(dd)
		if !ok || err1 != nil || err2 != nil || np < 1 || nd < 1 {
			return s, fmt.Errorf("%w: --pd-split %q: want P:D with P, D ≥ 1", errUsage, d.Split)
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
