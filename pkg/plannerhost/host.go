package plannerhost

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/perfmodel"
	"github.com/pdserve/pdserve/pkg/planner"
	"github.com/pdserve/pdserve/pkg/planner/actuator"
)

// Planner modes (--planner).
const (
	// Auto is Log when the planner has what it needs (a profile,
	// disaggregated mode, TTFT and TPOT targets in the policy), else Off.
	Auto = "auto"
	// Off runs no online planner.
	Off = "off"
	// Log re-plans, publishes and logs the desired replicas and changes
	// nothing.
	Log = "log"
	// Kubernetes also scales the prefill and decode Deployments through
	// the Kubernetes API (in-cluster service account).
	Kubernetes = "kubernetes"
)

// Options configure the online planner (package planner's Online):
// it keeps a window of finished requests, corrects the performance model
// by the observed/predicted times, re-plans every Interval, publishes
// each decision on control.PlanSubject and sets the gauges
// pdserve_pool_replicas{role,kind="desired|current"}. The SLO targets come
// from the coordinator's policy (coordinator.Options.Policy.SLO: ttft_ms,
// tpot_ms, attainment).
type Options struct {
	// Mode is Auto, Off, Log or Kubernetes.
	Mode string
	// Profile is the performance-model profile of the prefill and decode
	// workers (GPU/MODEL/tpN or a profile .json file); empty: the sim
	// engine's --profile in standalone mode.
	Profile string
	// DecodeProfile is the decode workers' profile when it differs (same
	// model, e.g. another GPU or tensor-parallel degree); empty: Profile.
	DecodeProfile string
	// ModelProfiles are the profiles of the served models of the policy's
	// tiers, by model (--planner-model-profile MODEL=PROFILE); a model of
	// the tiers not named here is planned with Profile (and
	// DecodeProfile). Only with tiers in the policy: then the planner
	// plans each served model of the tiers apart (see Host).
	ModelProfiles map[string]string
	// Codec is the KV codec the planner models; empty: the coordinator's
	// --codec, else
	// none.
	Codec string
	// CodecProfile is where the codecs' ratios and per-core speeds come
	// from: planner.CodecProfileBuiltin (also when empty), a file of
	// `coordinator codecs --out` measured on the workers' hardware, or
	// planner.CodecProfileSelf (this machine, measured at start).
	CodecProfile string
	// Interval is the time between re-plans, Window how far back finished
	// requests count, Cooldown the least time between two changes of the
	// desired replicas; all > 0.
	Interval, Window, Cooldown time.Duration
	// Headroom: plan for the observed rate × (1 + Headroom). Hysteresis:
	// scale down only to pools that also meet the SLO at the observed
	// rate × (1 + Headroom + Hysteresis). Both > 0.
	Headroom, Hysteresis float64
	// MinObservations is the fewest finished requests in the window to
	// re-plan on (≥ 2).
	MinObservations int
	// LinkGbps is each worker's bandwidth to the other pool, each
	// direction, Gb/s (> 0).
	LinkGbps float64
	// GPUBudget is the most GPUs both pools may use together; for a
	// CPU profile the most cores, a worker taking its profile's threads.
	// 0: planner.DefaultBudget (16 GPUs; a CPU profile: the logical CPUs
	// it was measured on).
	GPUBudget int
	// Roles moves elastic workers (those whose heartbeats say elastic)
	// between prefill and decode before the total changes
	// (planner.RoleOptions): at most one move per RoleDwell, for a
	// predicted attainment gain of RoleMinGain or more.
	Roles       bool
	RoleDwell   time.Duration
	RoleMinGain float64
	// Namespace, PrefillDeployment and DecodeDeployment name the
	// Deployments Kubernetes scales (required with it).
	Namespace, PrefillDeployment, DecodeDeployment string
	// PodLabels keeps the role label (actuator.RoleLabel) of each
	// elastic worker's pod in Namespace equal to the role its heartbeats
	// say (actuator.RoleLabels): the pod named by the worker's id, which
	// the chart sets to the pod's name. Needs Namespace and a planner
	// that is not off; any actuator mode. Flag --planner-pod-labels.
	PodLabels bool

	// KubeClient, when set, is the client of Kubernetes instead of
	// the in-cluster one (tests: actuatortest.NewFake). Not a flag.
	KubeClient actuator.Client
	// Ticks, when set, drives the re-planning instead of a ticker: each
	// value received is the time of a re-plan attempt (tests). Not a flag.
	Ticks <-chan time.Time
}

// DefaultOptions returns the flag defaults.
func DefaultOptions() Options {
	return Options{
		Mode:            Auto,
		Interval:        30 * time.Second,
		Window:          5 * time.Minute,
		Cooldown:        5 * time.Minute,
		Headroom:        0.2,
		Hysteresis:      0.15,
		MinObservations: 50,
		LinkGbps:        100,
		CodecProfile:    planner.CodecProfileBuiltin,
		RoleDwell:       2 * time.Minute,
		RoleMinGain:     0.02,
	}
}

// AddFlags registers the planner's flags on fs with p's values as
// defaults.
func (p *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&p.Mode, "planner", p.Mode, "online planner: auto (log when a profile is known, the mode is disaggregated and the policy sets slo.ttft_ms and slo.tpot_ms; else off), off, log (publish and log the desired replicas) or kubernetes (also scale the prefill and decode Deployments)")
	fs.StringVar(&p.Profile, "planner-profile", p.Profile, "performance-model profile of the workers the planner sizes, GPU/MODEL/tpN or a profile .json file (empty: --profile in standalone sim mode)")
	fs.StringVar(&p.DecodeProfile, "planner-decode-profile", p.DecodeProfile, "profile of the decode workers when it differs from --planner-profile (same model)")
	fs.Func("planner-model-profile", "MODEL=PROFILE: profile of a served model of the policy's tiers, whose pools the planner plans apart (repeatable; a model of the tiers not named: --planner-profile)", func(v string) error {
		model, prof, ok := strings.Cut(v, "=")
		if !ok || model == "" || prof == "" {
			return fmt.Errorf("want MODEL=PROFILE, got %q", v)
		}
		if _, dup := p.ModelProfiles[model]; dup {
			return fmt.Errorf("model %s given twice", model)
		}
		if p.ModelProfiles == nil {
			p.ModelProfiles = map[string]string{}
		}
		p.ModelProfiles[model] = prof
		return nil
	})
	fs.StringVar(&p.Codec, "planner-codec", p.Codec, "KV codec the planner models: "+strings.Join(planner.CodecNames(), ", ")+" (empty: --codec, else none)")
	fs.StringVar(&p.CodecProfile, "planner-codec-profile", p.CodecProfile, "codec ratios and per-core speeds the planner models: builtin, a file written by `coordinator codecs --out` on the workers' hardware, or self (measure this machine at start)")
	fs.DurationVar(&p.Interval, "planner-interval", p.Interval, "time between re-plans")
	fs.DurationVar(&p.Window, "planner-window", p.Window, "how far back finished requests count for the planner")
	fs.DurationVar(&p.Cooldown, "planner-cooldown", p.Cooldown, "least time between two changes of the desired replicas")
	fs.Float64Var(&p.Headroom, "planner-headroom", p.Headroom, "plan for the observed request rate × (1 + headroom); > 0")
	fs.Float64Var(&p.Hysteresis, "planner-hysteresis", p.Hysteresis, "scale down only to pools that meet the SLO at the observed rate × (1 + headroom + hysteresis); > 0")
	fs.IntVar(&p.MinObservations, "planner-min-observations", p.MinObservations, "fewest finished requests in the window to re-plan on (≥ 2)")
	fs.BoolVar(&p.Roles, "planner-roles", p.Roles, "move elastic workers between prefill and decode as the mix changes, before changing their total")
	fs.DurationVar(&p.RoleDwell, "planner-role-dwell", p.RoleDwell, "with --planner-roles: least time between two role moves")
	fs.Float64Var(&p.RoleMinGain, "planner-role-min-gain", p.RoleMinGain, "with --planner-roles: least predicted SLO attainment gain (a fraction) of a role move")
	fs.StringVar(&p.Namespace, "planner-namespace", p.Namespace, "kubernetes planner: namespace of the worker Deployments")
	fs.StringVar(&p.PrefillDeployment, "planner-prefill-deployment", p.PrefillDeployment, "kubernetes planner: name of the prefill worker Deployment")
	fs.StringVar(&p.DecodeDeployment, "planner-decode-deployment", p.DecodeDeployment, "kubernetes planner: name of the decode worker Deployment")
	fs.BoolVar(&p.PodLabels, "planner-pod-labels", p.PodLabels, "keep the "+actuator.RoleLabel+" label of each elastic worker's pod (named by the worker's id, in --planner-namespace, carrying "+actuator.PoolLabel+"="+actuator.ElasticPool+") equal to the role its heartbeats say, through the Kubernetes API (in-cluster service account, RBAC: patch pods)")
	fs.Float64Var(&p.LinkGbps, "link-gbps", p.LinkGbps, "planner: bandwidth between the pools per worker, each direction, Gb/s")
	fs.IntVar(&p.GPUBudget, "gpu-budget", p.GPUBudget, "planner: most GPUs the prefill and decode pools may use together; with a CPU profile (coordinator profile on a CPU) the most cores, a worker taking the profile's threads (0: 16 GPUs, or the logical CPUs the CPU profile was measured on)")
}

// Effective returns the planner's effective mode with the coordinator's
// (completed) options co, Auto resolved, and when it is off by Auto, why.
func (p Options) Effective(co coordinator.Options) (mode, why string) {
	if p.Mode != Auto {
		return p.Mode, ""
	}
	switch {
	case p.profile(co) == "" && len(p.ModelProfiles) == 0:
		return Off, "no --planner-profile (and not standalone with the sim engine)"
	case co.Mode != coordinator.ModeDisaggregated:
		return Off, "colocated mode: the planner sizes disaggregated pools"
	case co.Policy.SLO.TTFTMs <= 0 || co.Policy.SLO.TPOTMs <= 0:
		return Off, "the policy sets no slo.ttft_ms and slo.tpot_ms"
	}
	return Log, ""
}

// profile returns the profile the planner uses: --planner-profile, else
// the standalone sim engine's.
func (p Options) profile(co coordinator.Options) string {
	if p.Profile == "" && co.Standalone && co.Engine.Engine == enginecfg.Sim {
		return co.Engine.Profile
	}
	return p.Profile
}

// codec returns the codec the planner models.
func (p Options) codec(co coordinator.Options) string {
	switch {
	case p.Codec != "":
		return p.Codec
	case co.Codec != "":
		return co.Codec
	}
	return "none"
}

// Validate reports every invalid planner setting in one error, with the
// coordinator's completed options co. nil when the planner is off.
func (p Options) Validate(co coordinator.Options) error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	mode, _ := p.Effective(co)
	if p.PodLabels && p.Mode == Off {
		return invalid([]error{errors.New("planner-pod-labels needs the planner: not with --planner=off")})
	}
	switch mode {
	case Off:
		return nil
	case Log, Kubernetes:
	default:
		bad("planner %q must be %s, %s, %s or %s", p.Mode, Auto, Off, Log, Kubernetes)
		return invalid(errs)
	}
	if co.Mode != coordinator.ModeDisaggregated {
		bad("planner %s: the online planner sizes prefill and decode pools; use --planner=off in %s mode", mode, co.Mode)
	}
	models := tierModels(co)
	if len(models) == 0 && p.profile(co) == "" {
		bad("planner %s needs --planner-profile (standalone with the sim engine: --profile)", mode)
	}
	for _, m := range models {
		if p.ModelProfiles[m] == "" && p.profile(co) == "" {
			bad("planner %s: model %s of the policy's tiers has no profile: --planner-model-profile=%s=PROFILE or --planner-profile", mode, m, m)
		}
	}
	for _, m := range sortedKeys(p.ModelProfiles) {
		if !slices.Contains(models, m) {
			bad("planner-model-profile %s: no tier of the policy serves model %s", m, m)
		}
	}
	if mode == Kubernetes && len(models) > 0 {
		bad("planner kubernetes scales one prefill and one decode Deployment; with tiers in the policy it plans each model's pools apart: use --planner=log")
	}
	if co.Policy.SLO.TTFTMs <= 0 || co.Policy.SLO.TPOTMs <= 0 {
		bad("planner %s needs slo.ttft_ms and slo.tpot_ms > 0 in the --policy file", mode)
	}
	if p.Interval <= 0 || p.Window <= 0 || p.Cooldown <= 0 {
		bad("planner-interval %v, planner-window %v and planner-cooldown %v must be positive", p.Interval, p.Window, p.Cooldown)
	}
	if !(p.Headroom > 0) || !(p.Hysteresis > 0) {
		bad("planner-headroom %v and planner-hysteresis %v must be > 0", p.Headroom, p.Hysteresis)
	}
	if p.MinObservations < 2 {
		bad("planner-min-observations %d must be ≥ 2", p.MinObservations)
	}
	if mode == Kubernetes && (p.Namespace == "" || p.PrefillDeployment == "" || p.DecodeDeployment == "") {
		bad("planner kubernetes needs --planner-namespace, --planner-prefill-deployment and --planner-decode-deployment")
	}
	if p.PodLabels && p.Namespace == "" {
		bad("planner-pod-labels needs --planner-namespace")
	}
	if len(errs) > 0 {
		return invalid(errs)
	}
	// The planner's own checks: profile, codec, link, cost, GPU budget.
	cfgs, err := p.onlineConfigs(co)
	for _, cfg := range cfgs {
		if err == nil {
			_, err = planner.NewOnline(cfg, nil)
		}
	}
	if err != nil {
		errs = append(errs, err)
	}
	return invalid(errs)
}

// invalid joins errs into Validate's error, nil when there are none.
func invalid(errs []error) error {
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("coordinator: invalid options: %w", err)
	}
	return nil
}

// LogFields returns the effective planner settings as zap fields.
func (p Options) LogFields(co coordinator.Options) []zap.Field {
	mode, why := p.Effective(co)
	if mode == Off {
		return []zap.Field{zap.String("planner", mode), zap.String("planner_off_reason", why)}
	}
	f := []zap.Field{
		zap.String("planner", mode),
		zap.String("planner_profile", p.profile(co)),
		zap.String("planner_decode_profile", p.DecodeProfile),
		zap.Any("planner_model_profiles", p.ModelProfiles),
		zap.String("planner_codec", p.codec(co)),
		zap.String("planner_codec_profile", p.CodecProfile),
		zap.Duration("planner_interval", p.Interval),
		zap.Duration("planner_window", p.Window),
		zap.Duration("planner_cooldown", p.Cooldown),
		zap.Float64("planner_headroom", p.Headroom),
		zap.Float64("planner_hysteresis", p.Hysteresis),
		zap.Int("planner_min_observations", p.MinObservations),
		zap.Bool("planner_roles", p.Roles),
		zap.Duration("planner_role_dwell", p.RoleDwell),
		zap.Float64("planner_role_min_gain", p.RoleMinGain),
		zap.Float64("slo_attainment", co.Policy.SLO.AttainmentOrDefault()),
		zap.Float64("link_gbps", p.LinkGbps),
		zap.Int("gpu_budget", p.GPUBudget),
	}
	if mode == Kubernetes {
		f = append(f, zap.String("planner_namespace", p.Namespace),
			zap.String("planner_prefill_deployment", p.PrefillDeployment),
			zap.String("planner_decode_deployment", p.DecodeDeployment))
	}
	return f
}

// tierModels returns the distinct served models of co's policy's tiers,
// sorted; none without tiers.
func tierModels(co coordinator.Options) []string {
	var out []string
	for _, t := range co.Policy.Tiers {
		for _, m := range t.Models {
			if !slices.Contains(out, m) {
				out = append(out, m)
			}
		}
	}
	slices.Sort(out)
	return out
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// onlineConfigs builds the planners' configurations from the options,
// with the coordinator's co, without Publish, Actuator, Current and Log:
// without tiers in the policy one, for the pools of every model (Model
// ""); with tiers one per served model of the tiers, sorted by model,
// each with its model's profile. Errors: an unknown profile or codec.
func (p Options) onlineConfigs(co coordinator.Options) ([]planner.OnlineConfig, error) {
	models := tierModels(co)
	if len(models) == 0 {
		cfg, err := p.onlineConfig(co, "", p.profile(co), p.DecodeProfile)
		if err != nil {
			return nil, err
		}
		return []planner.OnlineConfig{cfg}, nil
	}
	var out []planner.OnlineConfig
	for _, m := range models {
		prof, dec, flag := p.ModelProfiles[m], "", "planner-model-profile "+m
		if prof == "" {
			prof, dec, flag = p.profile(co), p.DecodeProfile, "planner-profile"
		}
		cfg, err := p.onlineConfig(co, m, prof, dec)
		if err != nil {
			return nil, fmt.Errorf("%s (model %s): %w", flag, m, err)
		}
		out = append(out, cfg)
	}
	return out, nil
}

// onlineConfig builds the configuration of the planner of model's pools
// ("" for every model's) with the profiles profile and decodeProfile
// (""; profile). Errors: an unknown profile or codec.
func (p Options) onlineConfig(co coordinator.Options, model, profile, decodeProfile string) (planner.OnlineConfig, error) {
	prof, err := perfmodel.Resolve(profile)
	if err != nil {
		return planner.OnlineConfig{}, fmt.Errorf("planner-profile: %w", err)
	}
	var dec *perfmodel.Profile
	if decodeProfile != "" {
		if dec, err = perfmodel.Resolve(decodeProfile); err != nil {
			return planner.OnlineConfig{}, fmt.Errorf("planner-decode-profile: %w", err)
		}
		if dec.Model != prof.Model {
			return planner.OnlineConfig{}, fmt.Errorf("planner-decode-profile model %s differs from planner-profile model %s", dec.Model, prof.Model)
		}
	}
	cp, err := planner.LoadCodecProfile(p.CodecProfile)
	if err != nil {
		return planner.OnlineConfig{}, fmt.Errorf("planner-codec-profile: %w", err)
	}
	codec, err := cp.CodecFor(p.codec(co), p.LinkGbps*1e9/8, planner.DefaultCodecCores)
	if err != nil {
		return planner.OnlineConfig{}, fmt.Errorf("planner-codec: %w", err)
	}
	slo := co.Policy.SLO
	budget := p.GPUBudget
	if budget == 0 {
		budget = planner.DefaultBudget(prof)
	}
	return planner.OnlineConfig{
		Model: model,
		Base: planner.Config{
			Prefill: prof,
			Decode:  dec,
			SLO: planner.SLO{
				TTFT:       time.Duration(slo.TTFTMs * float64(time.Millisecond)),
				TPOT:       time.Duration(slo.TPOTMs * float64(time.Millisecond)),
				Attainment: slo.AttainmentOrDefault(),
			},
			LinkBytesPerSec: p.LinkGbps * 1e9 / 8,
			Codec:           codec,
			Policy:          planner.Policy(co.FirstTokenPolicy),
			GPUCostPerHour:  co.Policy.Pricing.GPUUSDPerHour,
			GPUBudget:       budget,
			Seed:            1,
		},
		Window:          p.Window,
		Interval:        p.Interval,
		Cooldown:        p.Cooldown,
		Headroom:        p.Headroom,
		Hysteresis:      p.Hysteresis,
		MinObservations: p.MinObservations,
		Roles:           planner.RoleOptions{Enabled: p.Roles, MinDwell: p.RoleDwell, MinGain: p.RoleMinGain},
	}, nil
}

// Host runs the online planner in a coordinator: a coordinator.Extension
// that observes every completed request's trace (planner.Online.Observe),
// re-plans every interval, publishes each planner.Decision on
// control.PlanSubject and hands it to the actuator (log, or the
// Kubernetes Deployments). Its methods are safe for concurrent use.
//
// Without tiers in the policy one planner sizes the prefill and decode
// pools from every request. With tiers, each served model of the tiers
// has its own pools (its workers report the model) and its own planner:
// it observes the requests that model served (budget.Trace's Model, the
// tier's model that answered) and, as demand, those it was passed over
// for (see ObserveTrace), counts only that model's workers as
// current replicas, plans with that model's profile, and publishes
// decisions naming the model; its gauges carry a label model. A request
// served by a model of no tier is planned by none. The actuator is then
// log only.
type Host struct {
	mode  string
	plans []*plan         // one without tiers (model ""), else one per model
	kube  actuator.Client // Options.KubeClient
	ko    actuator.KubernetesOptions
	ticks <-chan time.Time // nil: a ticker of every
	every time.Duration

	// With the Kubernetes actuator, set by Attach:
	kact    *actuator.Kubernetes
	log     *zap.Logger
	errs    *prometheus.CounterVec // pdserve_planner_actuator_errors_total{op}
	unsched *prometheus.GaugeVec   // pdserve_planner_unschedulable_pods{role}
	mu      sync.Mutex
	lastPod string // what CheckPods last logged, to log changes only

	// With PodLabels, set by Attach:
	podLabels bool
	labels    *actuator.RoleLabels
	members   *control.Membership
	lastLabel string // what SyncLabels last logged of its errors
}

var _ coordinator.Extension = (*Host)(nil)

// New builds the planner host of p for a coordinator of the completed,
// validated options co; nil (and no error) when the planner is off, which
// it logs on log with the reason. Add it to co.Extensions before
// coordinator.Start. Errors: an unknown profile or codec.
func New(p Options, co coordinator.Options, log *zap.Logger) (*Host, error) {
	if log == nil {
		log = zap.NewNop()
	}
	mode, why := p.Effective(co)
	if mode == Off {
		if why == "" {
			why = "--planner=off"
		}
		log.Named("planner").Info("online planner off", zap.String("reason", why))
		if p.PodLabels {
			log.Named("planner").Warn("planner off: elastic workers' pod labels are not kept (--planner-pod-labels)", zap.String("reason", why))
		}
		return nil, nil
	}
	cfgs, err := p.onlineConfigs(co)
	if err != nil {
		return nil, fmt.Errorf("planner: %w", err)
	}
	h := &Host{
		mode: mode, kube: p.KubeClient, ticks: p.Ticks, every: max(cfgs[0].Interval/10, 10*time.Millisecond),
		ko:        actuator.KubernetesOptions{Namespace: p.Namespace, PrefillDeployment: p.PrefillDeployment, DecodeDeployment: p.DecodeDeployment},
		podLabels: p.PodLabels,
	}
	for _, cfg := range cfgs {
		h.plans = append(h.plans, &plan{cfg: cfg})
	}
	return h, nil
}

// plan is the planner of one model's pools ("" : every model's).
type plan struct {
	cfg    planner.OnlineConfig
	online *planner.Online // set by Attach
}

// Models returns the served models planned apart, sorted; none without
// tiers in the policy.
func (p *Host) Models() []string {
	var out []string
	for _, pl := range p.plans {
		if pl.cfg.Model != "" {
			out = append(out, pl.cfg.Model)
		}
	}
	return out
}

// plan returns the planner of model's pools: without tiers the one
// planner, whatever the model; with tiers nil for a model of no tier.
func (p *Host) plan(model string) *plan {
	if len(p.plans) == 1 && p.plans[0].cfg.Model == "" {
		return p.plans[0]
	}
	for _, pl := range p.plans {
		if pl.cfg.Model == model {
			return pl
		}
	}
	return nil
}

// Base returns the planner's starting point: the configuration it plans
// from before any observation corrects it (profile, SLO, link, budget);
// with tiers, that of the first model (see BaseFor). The profiles are
// shared: do not modify them.
func (p *Host) Base() planner.Config { return p.plans[0].cfg.Base }

// BaseFor returns the starting point of model's planner (with tiers; ""
// without), and whether there is one.
func (p *Host) BaseFor(model string) (planner.Config, bool) {
	for _, pl := range p.plans {
		if pl.cfg.Model == model {
			return pl.cfg.Base, true
		}
	}
	return planner.Config{}, false
}

// Attach implements coordinator.Extension: it builds the actuator and the
// planners, registering their gauges on h.Registerer (with tiers, each
// model's with the label model). Errors: the actuator's (Kubernetes
// outside a cluster) and registration errors.
func (p *Host) Attach(h coordinator.Host) error {
	log := h.Log.Named("planner")
	var act planner.Actuator = actuator.NewLog(log)
	if p.mode == Kubernetes {
		var k *actuator.Kubernetes
		var err error
		if p.kube != nil {
			k, err = actuator.NewKubernetes(p.kube, p.ko)
		} else {
			k, err = actuator.NewInCluster(p.ko)
		}
		if err != nil {
			return fmt.Errorf("coordinator: planner: %w", err)
		}
		p.kact, p.log = k, log
		p.errs = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "pdserve", Name: "planner_actuator_errors_total",
			Help: actuatorErrorsHelp},
			[]string{"op"})
		p.unsched = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "pdserve", Name: "planner_unschedulable_pods",
			Help: "Pods of a pool's Deployment that the scheduler could not place (Pending, PodScheduled False), by role; the coordinator's log has the scheduler's reason."},
			[]string{"role"})
		for _, c := range []prometheus.Collector{p.errs, p.unsched} {
			if err := h.Registerer.Register(c); err != nil {
				return fmt.Errorf("coordinator: planner: register metrics: %w", err)
			}
		}
		for _, op := range []string{"scale", "pods"} {
			p.errs.WithLabelValues(op)
		}
		for _, role := range []control.Role{control.RolePrefill, control.RoleDecode} {
			p.unsched.WithLabelValues(string(role)).Set(0)
		}
		act = countingActuator{k, p.errs.WithLabelValues("scale")}
	}
	if p.podLabels {
		if err := p.attachLabels(h, log); err != nil {
			return err
		}
	}
	for _, pl := range p.plans {
		if err := pl.attach(h, log, act, p.mode); err != nil {
			return err
		}
	}
	return nil
}

// attach builds pl's planner in the coordinator h, with the actuator act
// of mode (without tiers; with tiers a log actuator of its own).
func (pl *plan) attach(h coordinator.Host, log *zap.Logger, act planner.Actuator, mode string) error {
	cfg := pl.cfg
	reg := h.Registerer
	model := cfg.Model
	if model != "" {
		reg = prometheus.WrapRegistererWith(prometheus.Labels{"model": model}, reg)
		log = log.With(zap.String("model", model))
		act, mode = actuator.NewLog(log), Log
	}
	cfg.Actuator = act
	cost := costGauge(cfg.Base)
	if cost != nil {
		if err := reg.Register(cost); err != nil {
			return fmt.Errorf("coordinator: planner: register metrics: %w", err)
		}
	}
	var online *planner.Online
	// Run calls Publish once per decision, after it set the desired
	// replicas: the place to update the cost of the desired pools too.
	cfg.Publish = func(subject string, data []byte) error {
		if cost != nil {
			p, d := online.Desired()
			tpD := cfg.Base.Prefill.Units()
			if cfg.Base.Decode != nil {
				tpD = cfg.Base.Decode.Units()
			}
			cost.Set(float64(p*cfg.Base.Prefill.Units()+d*tpD) * cfg.Base.GPUCostPerHour)
		}
		return h.Publish(subject, data)
	}
	cfg.Current = func() (prefill, decode int) {
		return countModel(h.Members.Members(control.RolePrefill), model), countModel(h.Members.Members(control.RoleDecode), model)
	}
	cfg.Log = log
	if cfg.Roles.Enabled {
		cfg.RoleActuator = roleMover{members: h.Members, command: h.Command, model: model, log: log}
	}
	var err error
	if online, err = planner.NewOnline(cfg, reg); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	pl.online = online
	log.Info("online planner on", zap.String("actuator", mode), zap.String("profile", cfg.Base.Prefill.Name),
		zap.Int("budget", cfg.Base.GPUBudget), zap.String("budget_unit", cfg.Base.Prefill.UnitName()),
		zap.Duration("interval", cfg.Interval), zap.Duration("window", cfg.Window))
	return nil
}

// countModel counts the workers of members serving model; all of them
// for "".
func countModel(members []control.Heartbeat, model string) int {
	if model == "" {
		return len(members)
	}
	n := 0
	for _, hb := range members {
		if hb.Model == model {
			n++
		}
	}
	return n
}

// costGauge returns the gauge of the desired pools' cost, or nil without
// a GPU price.
func costGauge(base planner.Config) prometheus.Gauge {
	if base.GPUCostPerHour <= 0 {
		return nil
	}
	return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "pdserve", Name: "planner_desired_cost_usd_per_hour",
		Help: "USD per hour of the GPUs of the pools the planner desires (the policy's pricing.gpu_usd_per_hour × GPUs)."})
}

// ObserveTrace implements coordinator.Extension: the trace of a completed
// request becomes an observation of the planner of the model that served
// it (with tiers, none for a model of no tier), and demand of the tier's
// models passed over before it (budget.Objective.TierPassed: down,
// shedding, draining or predicted over budget; planner.Observation.Demand).
// A model's pools are so sized for what asked for it, not only for what
// it served: a fast tier that sheds its overflow to the quality tier
// would otherwise never look short.
func (p *Host) ObserveTrace(t *budget.Trace) {
	ob := planner.ObservationFromTrace(t)
	if pl := p.plan(t.Model); pl != nil {
		pl.online.Observe(ob)
	}
	if len(p.plans) == 1 && p.plans[0].cfg.Model == "" {
		return // one planner for every model: it has the request already
	}
	for _, m := range t.Objective.TierPassed {
		if pl := p.plan(m); pl != nil && m != t.Model {
			pl.online.Observe(ob.Demand(m))
		}
	}
}

// ObserveRefused implements coordinator.RefusalObserver: a request the
// pools refused for want of room, or another region served instead, is
// demand of its model's planner
// (planner.RefusedObservation), which it would not see otherwise: pools
// that refuse what they cannot hold look, from what they served alone,
// as if they had room to spare.
func (p *Host) ObserveRefused(t *budget.Trace, maxTokens int) {
	if pl := p.plan(t.Model); pl != nil {
		pl.online.Observe(planner.RefusedObservation(t.Model, t.Arrival, t.PromptTokens, maxTokens))
	}
}

// ObserveServedRetry implements coordinator.RetryObserver: a request
// served on a retry of one ObserveRefused counted is observed for its
// measured terms only (planner.Observation.TermsOnly), not as demand
// again.
func (p *Host) ObserveServedRetry(t *budget.Trace) {
	if pl := p.plan(t.Model); pl != nil {
		ob := planner.ObservationFromTrace(t)
		ob.TermsOnly = true
		pl.online.Observe(ob)
	}
}

// Run implements coordinator.Extension: it re-plans until ctx ends; with
// the Kubernetes actuator it also runs CheckPods every planner interval.
func (p *Host) Run(ctx context.Context) {
	ticks := p.ticks
	if ticks == nil {
		t := time.NewTicker(p.every)
		defer t.Stop()
		ticks = t.C
	}
	var wg sync.WaitGroup
	every := func(d time.Duration, f func(context.Context)) {
		wg.Go(func() {
			t := time.NewTicker(d)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					f(ctx)
				}
			}
		})
	}
	if p.labels != nil {
		every(p.every, p.SyncLabels)
	}
	if p.kact != nil {
		every(p.plans[0].cfg.Interval, p.CheckPods)
	}
	// Every tick goes to each planner, in order.
	chans := make([]chan time.Time, len(p.plans))
	for i, pl := range p.plans {
		chans[i] = make(chan time.Time)
		wg.Go(func() { _ = pl.online.Run(ctx, chans[i]) }) // returns nil when ctx ends
	}
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-ticks:
			for _, c := range chans {
				select {
				case c <- now:
				case <-ctx.Done():
					return
				}
			}
		}
	}
}

// CheckPods looks for pods of the two worker Deployments that the
// scheduler cannot place (actuator.Kubernetes.Unschedulable), as Run does
// every planner interval with the Kubernetes actuator: it sets
// pdserve_planner_unschedulable_pods{role}, and logs a warning with each
// pod and the scheduler's message when the set changes (an error of the
// API, e.g. without the RBAC to list pods, likewise, and counts it in
// pdserve_planner_actuator_errors_total{op="pods"}). A no-op without the
// Kubernetes actuator.
func (p *Host) CheckPods(ctx context.Context) {
	if p.kact == nil {
		return
	}
	pods, err := p.kact.Unschedulable(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		p.errs.WithLabelValues("pods").Inc()
		p.logChange("error: "+err.Error(), func() { p.log.Warn("planner: list the pools' pods", zap.Error(err)) })
		return
	}
	count := map[control.Role]int{}
	var desc []string
	for _, u := range pods {
		role := control.RoleDecode
		if u.Deployment == p.ko.PrefillDeployment {
			role = control.RolePrefill
		}
		count[role]++
		desc = append(desc, u.Pod+": "+u.Reason+": "+u.Message)
	}
	for _, role := range []control.Role{control.RolePrefill, control.RoleDecode} {
		p.unsched.WithLabelValues(string(role)).Set(float64(count[role]))
	}
	p.logChange(strings.Join(desc, "\n"), func() {
		for _, u := range pods {
			p.log.Warn("planner: pool pod cannot be scheduled", zap.String("deployment", u.Deployment),
				zap.String("pod", u.Pod), zap.String("reason", u.Reason), zap.String("message", u.Message))
		}
		if len(pods) == 0 {
			p.log.Info("planner: every pool pod is scheduled")
		}
	})
}

// logChange calls log when state differs from the last one logged (the
// first state logged is "": all scheduled, nothing to say).
func (p *Host) logChange(state string, log func()) {
	p.mu.Lock()
	changed := state != p.lastPod
	p.lastPod = state
	p.mu.Unlock()
	if changed {
		log()
	}
}

// countingActuator counts the failed Scale calls of an actuator.
type countingActuator struct {
	planner.Actuator
	errs prometheus.Counter
}

// Scale implements planner.Actuator.
func (c countingActuator) Scale(ctx context.Context, prefill, decode int) error {
	err := c.Actuator.Scale(ctx, prefill, decode)
	if err != nil && !errors.Is(err, context.Canceled) {
		c.errs.Inc()
	}
	return err
}

// Online returns the running planner; nil before the coordinator's Start
// attached it, and with tiers in the policy (see OnlineFor).
func (p *Host) Online() *planner.Online {
	if len(p.plans) == 1 && p.plans[0].cfg.Model == "" {
		return p.plans[0].online
	}
	return nil
}

// OnlineFor returns the running planner of model's pools (with tiers in
// the policy); nil for a model of no tier and before Start.
func (p *Host) OnlineFor(model string) *planner.Online {
	for _, pl := range p.plans {
		if pl.cfg.Model == model && model != "" {
			return pl.online
		}
	}
	return nil
}

// roleCommandTimeout bounds one role command's reply (the worker replies
// once it accepted the move; the change runs in the background).
const roleCommandTimeout = 5 * time.Second

// roleMover is the planner's RoleActuator: it sends control.CmdRole to
// elastic workers of the old role, the least loaded first.
type roleMover struct {
	members *control.Membership
	command func(ctx context.Context, role, id string, c control.Command) error
	model   string // "" for every worker; else only this model's (a tier's plan)
	log     *zap.Logger
}

// MoveRoles implements planner.RoleActuator. Errors: fewer elastic
// workers of role from than n (those there are move), and the
// commands' errors, joined.
func (m roleMover) MoveRoles(ctx context.Context, from, to string, n int) error {
	var cands []control.Heartbeat
	for _, hb := range m.members.Members(control.Role(from)) {
		if hb.Elastic && !hb.Draining && (m.model == "" || hb.Model == m.model) {
			cands = append(cands, hb)
		}
	}
	slices.SortFunc(cands, func(a, b control.Heartbeat) int {
		return cmp.Or(cmp.Compare(a.RunningBatch+a.QueuedPrefillTokens, b.RunningBatch+b.QueuedPrefillTokens), strings.Compare(a.ID, b.ID))
	})
	var errs []error
	if len(cands) < n {
		errs = append(errs, fmt.Errorf("planner: %d elastic %s workers to move to %s, want %d", len(cands), from, to, n))
	}
	for _, hb := range cands[:min(n, len(cands))] {
		cctx, cancel := context.WithTimeout(ctx, roleCommandTimeout)
		err := m.command(cctx, from, hb.ID, control.Command{Kind: control.CmdRole, Arg: to,
			// never a role's last worker: another decode worker remains
			Migrate: from != string(control.RolePrefill)})
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		m.log.Info("worker moved", zap.String("worker", hb.ID), zap.String("from", from), zap.String("to", to))
	}
	return errors.Join(errs...)
}

// actuatorErrorsHelp is the help of pdserve_planner_actuator_errors_total.
const actuatorErrorsHelp = "Failed calls of the planner's Kubernetes actuator: op scale (setting a pool's replicas), pods (listing the pools' pods), label (setting an elastic worker pod's role label); the coordinator's log has each error."

// attachLabels builds the pod labeler of --planner-pod-labels and its
// error counter (pdserve_planner_actuator_errors_total{op="label"}).
func (p *Host) attachLabels(h coordinator.Host, log *zap.Logger) error {
	client := p.kube
	if client == nil {
		var err error
		if client, err = actuator.InClusterClient(); err != nil {
			return fmt.Errorf("coordinator: planner: pod labels: %w", err)
		}
	}
	l, err := actuator.NewLabeler(client, p.ko.Namespace)
	if err != nil {
		return fmt.Errorf("coordinator: planner: %w", err)
	}
	if p.errs == nil {
		p.errs = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "pdserve", Name: "planner_actuator_errors_total",
			Help: actuatorErrorsHelp},
			[]string{"op"})
		if err := h.Registerer.Register(p.errs); err != nil {
			return fmt.Errorf("coordinator: planner: register metrics: %w", err)
		}
	}
	p.errs.WithLabelValues("label")
	p.labels, p.members, p.log = actuator.NewRoleLabels(l), h.Members, log
	log.Info("planner: elastic workers' pod labels kept", zap.String("namespace", p.ko.Namespace), zap.String("label", actuator.RoleLabel))
	return nil
}

// SyncLabels sets the role label of each elastic worker's pod to the role
// of its last heartbeat (actuator.RoleLabels.Sync), as Run does every
// tenth of the planner interval with --planner-pod-labels: it logs each
// pod it relabels, counts a failed patch in
// pdserve_planner_actuator_errors_total{op="label"} and logs the errors
// when they differ from the last ones logged. A no-op without
// --planner-pod-labels.
func (p *Host) SyncLabels(ctx context.Context) {
	if p.labels == nil {
		return
	}
	var ws []actuator.Worker
	for _, hb := range p.members.All() {
		if hb.Elastic {
			ws = append(ws, actuator.Worker{Pod: hb.ID, Role: hb.Role})
		}
	}
	patched, err := p.labels.Sync(ctx, ws)
	for _, w := range patched {
		p.log.Info("planner: elastic worker's pod relabeled", zap.String("pod", w.Pod), zap.String(actuator.RoleLabel, w.Role))
	}
	state := ""
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		p.errs.WithLabelValues("label").Inc()
		state = err.Error()
	}
	p.mu.Lock()
	changed := state != p.lastLabel
	p.lastLabel = state
	p.mu.Unlock()
	if changed && err != nil {
		p.log.Warn("planner: set elastic workers' pod labels", zap.Error(err))
	}
}
