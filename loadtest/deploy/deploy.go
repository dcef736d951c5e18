package deploy

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pdserve/pdserve/loadtest/report"
	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/perfmodel"
	"github.com/pdserve/pdserve/pkg/plannerhost"
	"github.com/pdserve/pdserve/pkg/standalone"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// Modes.
const (
	Disaggregated = coordinator.ModeDisaggregated
	Colocated     = coordinator.ModeColocated
)

// Spec describes a local deployment.
type Spec struct {
	// Mode is Disaggregated or Colocated.
	Mode string
	// Engine is "sim" (performance model, default), "ref" or "llamacpp".
	Engine string
	// Profile is the sim engine's GPU/MODEL/tpN profile.
	Profile string
	// Preset is the ref engine's model preset.
	Preset string
	// TimeScale multiplies the sim engine's step times (1: real time).
	TimeScale float64
	// PayloadScale is the fraction of the true KV bytes the sim engine
	// hands out, in (0, 1] (0 means 1); transfers stay paced for the true
	// size, so a small scale keeps the CPU cost of moving KV low.
	PayloadScale float64
	// PrefillWorkers and DecodeWorkers: disaggregated P and D; colocated
	// uses DecodeWorkers colocated workers.
	PrefillWorkers, DecodeWorkers int
	// Codec is the KV codec (disaggregated; "" = the worker default).
	Codec string
	// LinkGbps paces KV transfers as over a link of this many Gbit/s (0:
	// unpaced).
	LinkGbps float64
	// FirstTokenPolicy is "prefill" or "decode" (disaggregated).
	FirstTokenPolicy string
	// ChunkTokens and MaxBatchTokens are the chunked-prefill step budget
	// (per-sequence chunk and tokens per step) of prefill workers and of
	// decode/colocated workers' local prefill; 0 keeps the worker default.
	ChunkTokens, MaxBatchTokens int
	// MaxBatch caps sequences per decode step; 0 keeps the default.
	MaxBatch int
	// KVBlocks sizes each decode/colocated worker's KV pool; 0 keeps the
	// worker default.
	KVBlocks int
	// QueueLimit is the coordinator's admission limit; 0 keeps the default.
	QueueLimit int
	// PolicyFile is the coordinator's policy YAML (--policy: routing
	// weights, limits); "" keeps the default policy.
	PolicyFile string
	// ModelName is the served model name ("" = the engine's).
	ModelName string
	// TierProfile, with TierPrefillWorkers and TierDecodeWorkers, adds a
	// second pool of sim workers serving another profile's model beside
	// the first (its workers numbered after the first pool's), for a
	// policy whose tiers list both models. "": one pool.
	TierProfile                           string
	TierPrefillWorkers, TierDecodeWorkers int

	// Model is the llamacpp engine's GGUF file.
	Model string
	// LlamaLib is the directory of llama.cpp's libraries ("" = the
	// engine's default).
	LlamaLib string
	// CtxSize and MaxSeqs size each llamacpp worker's KV cache (tokens;
	// 0 = the model's context) and its sequences (0 = the engine default).
	CtxSize, MaxSeqs int
	// NoRepack keeps llamacpp weights in their file layout.
	NoRepack bool
	// Elastic starts the in-process workers elastic
	// (standalone.WithElasticWorkers): the online planner's role moves
	// (Planner.Roles) can move them between prefill and decode. Sim and
	// ref engines only.
	Elastic bool
	// RoleChangeRestart, with Elastic, makes each role change stand for
	// a Deployment replacing a pod (workerrun.Options.RoleChangeRestart):
	// sequences finish instead of moving, and the worker serves its new
	// role this long after it drained.
	RoleChangeRestart time.Duration
	// Planner, when set, runs the coordinator's online planner with
	// these options (its flags, --planner-*); SLO then sets the policy's
	// slo.ttft_ms and slo.tpot_ms it plans for.
	Planner *plannerhost.Options
	SLO     config.SLO
	// Metrics, when set, receives the in-process workers' metrics
	// (labelled worker=ID) instead of a registry of the deployment's
	// own: the caller reads their role changes from it.
	Metrics prometheus.Registerer

	// CPUs are the cores of a llamacpp deployment. Each worker runs as a
	// process of its own pinned to its share of them, with one engine
	// thread per core: the disaggregated workers split them evenly in
	// order (prefill first), the one colocated worker takes them all.
	CPUs []int
}

// ErrSpec reports an unusable Spec.
var ErrSpec = errors.New("deploy: bad spec")

// TP returns the GPUs per worker: the profile's tensor-parallel degree
// (1 for the ref engine).
func (s Spec) TP() (int, error) {
	if s.engine() != enginecfg.Sim {
		return 1, nil // ref: one worker each; llamacpp: counted in cores (GPUs)
	}
	p, err := perfmodel.Resolve(s.Profile)
	if err == nil {
		return p.TP, nil
	}
	// Fall back to the name's tpN suffix.
	if i := strings.LastIndex(s.Profile, "/tp"); i >= 0 {
		if n, err2 := strconv.Atoi(s.Profile[i+3:]); err2 == nil && n > 0 {
			return n, nil
		}
	}
	return 0, fmt.Errorf("%w: profile %q: %v", ErrSpec, s.Profile, err)
}

// GPUs returns the deployment's GPU count: workers × TP.
//
// A llamacpp deployment counts its cores instead: len(CPUs).
func (s Spec) GPUs() (int, error) {
	if s.engine() == enginecfg.Llama {
		return len(s.CPUs), nil
	}
	tp, err := s.TP()
	if err != nil {
		return 0, err
	}
	return s.workers() * tp, nil
}

func (s Spec) workers() int {
	if s.Mode == Colocated {
		return s.DecodeWorkers
	}
	return s.PrefillWorkers + s.DecodeWorkers
}

func (s Spec) engine() string {
	if s.Engine == "" {
		return enginecfg.Sim
	}
	return s.Engine
}

// Options returns the coordinator options that run s (its in-process
// workers' own settings: workerOptions).
func (s Spec) Options() (coordinator.Options, error) {
	o := coordinator.DefaultOptions()
	o.HTTPAddr = "127.0.0.1:0"
	o.NATSListen = "127.0.0.1:-1"
	o.Standalone = true
	o.Mode = s.Mode
	o.PrefillWorkers, o.DecodeWorkers = s.PrefillWorkers, s.DecodeWorkers
	if s.TierProfile != "" {
		if s.engine() != enginecfg.Sim || s.ModelName != "" || s.TierPrefillWorkers < 0 || s.TierDecodeWorkers <= 0 ||
			(s.Mode == Disaggregated) != (s.TierPrefillWorkers > 0) {
			return o, fmt.Errorf("%w: a second pool (tier profile %s) needs the sim engine, no model name, and workers of each role its mode needs", ErrSpec, s.TierProfile)
		}
		o.PrefillWorkers += s.TierPrefillWorkers
		o.DecodeWorkers += s.TierDecodeWorkers
	}
	o.Codec = s.Codec
	if s.FirstTokenPolicy != "" {
		o.FirstTokenPolicy = s.FirstTokenPolicy
	}
	if s.QueueLimit > 0 {
		o.PolicyEdits = append(o.PolicyEdits, func(p *config.Policy) { p.Limits.QueueLimit = s.QueueLimit })
	}
	if s.Planner != nil {
		slo := s.SLO
		o.PolicyEdits = append(o.PolicyEdits, func(p *config.Policy) { p.SLO = slo })
	}
	o.PolicyFile = s.PolicyFile
	o.ModelName = s.ModelName
	o.HeartbeatTTL = 2 * time.Second
	o.ShutdownTimeout = 10 * time.Second
	o.LogLevel = "warn"
	o.Engine.Engine = s.engine()
	if o.Engine.Engine == enginecfg.Sim {
		o.Engine.Profile = s.Profile
		o.Engine.TimeScale = s.TimeScale
		if o.Engine.TimeScale == 0 {
			o.Engine.TimeScale = 1
		}
		if s.PayloadScale > 0 {
			o.Engine.PayloadScale = s.PayloadScale
		}
	} else if o.Engine.Engine == enginecfg.Llama {
		// The coordinator loads the model's vocabulary alone, to tokenize.
		o.Engine.Model, o.Engine.LlamaLib, o.Engine.CtxSize, o.Engine.NoRepack = s.Model, s.LlamaLib, s.CtxSize, s.NoRepack
		if s.MaxSeqs > 0 {
			o.Engine.MaxSeqs = s.MaxSeqs
		}
		o.Standalone = false
		if _, _, err := s.workerCPUs(); err != nil {
			return o, err
		}
	} else if s.Preset != "" {
		o.Engine.Preset = s.Preset
	}
	if err := o.Complete(); err != nil {
		return o, fmt.Errorf("%w: %v", ErrSpec, err)
	}
	if err := o.Validate(); err != nil {
		return o, fmt.Errorf("%w: %v", ErrSpec, err)
	}
	return o, nil
}

// workerOptions edits the options of each in-process worker of s.
func (s Spec) workerOptions(w *workerrun.Options) {
	w.HeartbeatInterval = 200 * time.Millisecond
	w.PaceGbps = s.LinkGbps
	if s.ChunkTokens > 0 {
		w.Prefill.ChunkTokens, w.Decode.ChunkTokens = s.ChunkTokens, s.ChunkTokens
	}
	if s.MaxBatchTokens > 0 {
		w.Prefill.MaxBatchTokens, w.Decode.MaxBatchTokens = s.MaxBatchTokens, s.MaxBatchTokens
	}
	if s.MaxBatch > 0 {
		w.Decode.MaxBatch = s.MaxBatch
	}
	if s.KVBlocks > 0 {
		w.Decode.KVBlocks = s.KVBlocks
	}
	if s.Codec != "" {
		w.Prefill.Codec = s.Codec
	}
	w.RoleChangeRestart = s.RoleChangeRestart
	if s.Metrics != nil {
		w.Registerer = s.Metrics
	}
	if s.TierProfile != "" {
		// Workers are numbered ROLE-i in each role; the first pool's come
		// first.
		first := s.DecodeWorkers
		if w.Role == control.RolePrefill {
			first = s.PrefillWorkers
		}
		if i := strings.LastIndexByte(w.ID, '-'); i >= 0 {
			if n, err := strconv.Atoi(w.ID[i+1:]); err == nil && n >= first {
				w.Engine.Profile = s.TierProfile
			}
		}
	}
}

// Facts lists what s runs, for reports: engine and profile, workers and
// split, the KV path (codec, link, first-token policy) and the step
// budget, with worker defaults filled in.
func (s Spec) Facts() report.Object {
	var f report.Object
	switch s.engine() {
	case enginecfg.Sim:
		f.Add("engine", fmt.Sprintf("sim %s (time scale %g, KV payload scale %.3g)", s.Profile, nonZero(s.TimeScale, 1), nonZero(s.PayloadScale, 1)))
	case enginecfg.Llama:
		f.Add("engine", fmt.Sprintf("llamacpp %s (ctx %d, repack %v)", filepath.Base(s.Model), s.CtxSize, !s.NoRepack))
		if cpus, roles, err := s.workerCPUs(); err == nil {
			var ps []string
			for i, r := range roles {
				ps = append(ps, fmt.Sprintf("%s on cores %v (%d threads)", r, cpus[i], len(cpus[i])))
			}
			f.Add("pinning", strings.Join(ps, "; ")+"; coordinator unpinned")
		}
	default:
		f.Add("engine", fmt.Sprintf("ref %s", s.Preset))
	}
	wo := workerrun.NewDecodeOptions()
	po := workerrun.NewPrefillOptions()
	chunk, budget := nonZeroInt(s.ChunkTokens, wo.Decode.ChunkTokens), nonZeroInt(s.MaxBatchTokens, wo.Decode.MaxBatchTokens)
	maxBatch := nonZeroInt(s.MaxBatch, wo.Decode.MaxBatch)
	kvBlocks := nonZeroInt(s.KVBlocks, wo.Decode.KVBlocks)
	if s.Mode == Colocated {
		f.Add("workers", fmt.Sprintf("%d colocated", s.DecodeWorkers))
		f.Add("P:D split", "— (colocated)")
		f.Add("KV codec / link", "— (no transfer)")
		f.Add("first-token policy", "—")
		f.Add("step budget", fmt.Sprintf("chunked prefill: %d-token chunks, %d tokens/step, ≤ %d seqs/step", chunk, budget, maxBatch))
	} else {
		f.Add("workers", fmt.Sprintf("%d prefill + %d decode", s.PrefillWorkers, s.DecodeWorkers))
		f.Add("P:D split", fmt.Sprintf("%d:%d", s.PrefillWorkers, s.DecodeWorkers))
		codec := s.Codec
		if codec == "" {
			codec = po.Prefill.Codec
		}
		link := "unpaced"
		if s.LinkGbps > 0 {
			link = fmt.Sprintf("%g Gb/s", s.LinkGbps)
		}
		f.Add("KV codec / link", fmt.Sprintf("%s, %s", codec, link))
		f.Add("first-token policy", nonEmpty(s.FirstTokenPolicy, coordinator.PolicyPrefill))
		f.Add("step budget", fmt.Sprintf("prefill: %d-token chunks, %d tokens/step; decode ≤ %d seqs/step",
			nonZeroInt(s.ChunkTokens, po.Prefill.ChunkTokens), nonZeroInt(s.MaxBatchTokens, po.Prefill.MaxBatchTokens), maxBatch))
	}
	if s.engine() == enginecfg.Llama {
		cells := "the model's context"
		if s.CtxSize > 0 {
			cells = fmt.Sprint(s.CtxSize)
		}
		f.Add("KV cache per worker", fmt.Sprintf("llama.cpp: %s cells, ≤ %d sequences", cells, nonZeroInt(s.MaxSeqs, enginecfg.DefaultOptions().MaxSeqs)))
	} else {
		f.Add("KV pool per decode worker", fmt.Sprintf("%d blocks × %d tokens", kvBlocks, wo.Decode.BlockTokens))
	}
	return f
}

func nonZero(x, def float64) float64 {
	if x == 0 {
		return def
	}
	return x
}

func nonZeroInt(x, def int) int {
	if x == 0 {
		return def
	}
	return x
}

func nonEmpty(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// server is what a local deployment runs: a standalone server, or a
// coordinator with worker processes.
type server interface {
	HTTPAddr() string
	Ready() error
	Shutdown(ctx context.Context) error
}

// Local is a running local deployment.
type Local struct {
	c    server
	spec Spec
}

// readyWait bounds how long Start waits for the workers to join.
const readyWait = 60 * time.Second

// Start starts s and returns once it is ready to serve (every role has a
// worker in the membership). log receives the deployment's logs (nil:
// none). Errors: ErrSpec, start errors, or not ready in time (what was
// started is stopped again).
func Start(ctx context.Context, s Spec, log *zap.Logger) (*Local, error) {
	o, err := s.Options()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	var c server
	if s.Planner != nil {
		host, err := plannerhost.New(*s.Planner, o, log)
		if err != nil {
			return nil, fmt.Errorf("%w: planner: %v", ErrSpec, err)
		}
		if host == nil {
			return nil, fmt.Errorf("%w: the planner is off (see its log)", ErrSpec)
		}
		o.Extensions = append(o.Extensions, host)
	}
	if s.engine() == enginecfg.Llama {
		if s.Elastic || s.Planner != nil {
			return nil, fmt.Errorf("%w: elastic workers and the online planner run on the sim and ref engines", ErrSpec)
		}
		c, err = startProcs(ctx, s, o, log)
	} else {
		opts := []standalone.Option{standalone.WithWorkerOptions(s.workerOptions)}
		if s.Elastic {
			opts = append(opts, standalone.WithElasticWorkers())
		}
		c, err = standalone.Start(ctx, o, log, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("deploy: start %s: %w", s.Mode, err)
	}
	l := &Local{c: c, spec: s}
	deadline := time.NewTimer(readyWait)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		rerr := c.Ready()
		if rerr == nil {
			return l, nil
		}
		select {
		case <-ctx.Done():
			l.Close(context.Background())
			return nil, ctx.Err()
		case <-deadline.C:
			l.Close(context.Background())
			return nil, fmt.Errorf("deploy: %s deployment not ready within %v: %v", s.Mode, readyWait, rerr)
		case <-tick.C:
		}
	}
}

// URL returns the deployment's base URL (http://127.0.0.1:PORT).
func (l *Local) URL() string { return "http://" + l.c.HTTPAddr() }

// Spec returns what runs.
func (l *Local) Spec() Spec { return l.spec }

// Processes returns the worker processes of a llamacpp deployment (nil
// for the others, whose workers run in this process).
func (l *Local) Processes() []Process {
	if p, ok := l.c.(*procs); ok {
		return p.processes()
	}
	return nil
}

// Close stops the deployment gracefully, bounded by ctx.
func (l *Local) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return l.c.Shutdown(ctx)
}
