package coordinator

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/frontend"
	"github.com/pdserve/pdserve/pkg/perfmodel"
	"github.com/pdserve/pdserve/pkg/planner"
	"github.com/pdserve/pdserve/pkg/planner/actuator"
)

// Planner modes (--planner).
const (
	// PlannerAuto is PlannerLog when the planner has what it needs (a
	// profile, disaggregated mode, TTFT and TPOT targets in the policy),
	// else PlannerOff.
	PlannerAuto = "auto"
	// PlannerOff runs no online planner.
	PlannerOff = "off"
	// PlannerLog re-plans, publishes and logs the desired replicas and
	// changes nothing.
	PlannerLog = "log"
	// PlannerKubernetes also scales the prefill and decode Deployments
	// through the Kubernetes API (in-cluster service account).
	PlannerKubernetes = "kubernetes"
)

// PlannerOptions configure the online planner (package planner's Online):
// it keeps a window of finished requests, corrects the performance model
// by the observed/predicted times, re-plans every Interval, publishes
// each decision on control.PlanSubject and sets the gauges
// pdserve_pool_replicas{role,kind="desired|current"}. The SLO targets come
// from the policy (Options.Policy.SLO: ttft_ms, tpot_ms, attainment).
type PlannerOptions struct {
	// Mode is PlannerAuto, PlannerOff, PlannerLog or PlannerKubernetes.
	Mode string
	// Profile is the performance-model profile of the prefill and decode
	// workers (GPU/MODEL/tpN or a profile .json file); empty: the sim
	// engine's --profile in standalone mode.
	Profile string
	// DecodeProfile is the decode workers' profile when it differs (same
	// model, e.g. another GPU or tensor-parallel degree); empty: Profile.
	DecodeProfile string
	// Codec is the KV codec the planner models; empty: Options.Codec, else
	// none.
	Codec string
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
	// GPUCostPerHour is USD per GPU-hour (≥ 0; 0: unknown, no cost gauge).
	GPUCostPerHour float64
	// GPUBudget is the most GPUs both pools may use together.
	GPUBudget int
	// Namespace, PrefillDeployment and DecodeDeployment name the
	// Deployments PlannerKubernetes scales (required with it).
	Namespace, PrefillDeployment, DecodeDeployment string

	// KubeClient, when set, is the client of PlannerKubernetes instead of
	// the in-cluster one (tests: a fake clientset). Not a flag.
	KubeClient kubernetes.Interface
	// Ticks, when set, drives the re-planning instead of a ticker: each
	// value received is the time of a re-plan attempt (tests). Not a flag.
	Ticks <-chan time.Time
}

// DefaultPlannerOptions returns the flag defaults.
func DefaultPlannerOptions() PlannerOptions {
	return PlannerOptions{
		Mode:            PlannerAuto,
		Interval:        30 * time.Second,
		Window:          5 * time.Minute,
		Cooldown:        5 * time.Minute,
		Headroom:        0.2,
		Hysteresis:      0.15,
		MinObservations: 50,
		LinkGbps:        100,
		GPUBudget:       16,
	}
}

// AddFlags registers the planner's flags on fs with p's values as
// defaults.
func (p *PlannerOptions) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&p.Mode, "planner", p.Mode, "online planner: auto (log when a profile is known, the mode is disaggregated and the policy sets slo.ttft_ms and slo.tpot_ms; else off), off, log (publish and log the desired replicas) or kubernetes (also scale the prefill and decode Deployments)")
	fs.StringVar(&p.Profile, "planner-profile", p.Profile, "performance-model profile of the workers the planner sizes, GPU/MODEL/tpN or a profile .json file (empty: --profile in standalone sim mode)")
	fs.StringVar(&p.DecodeProfile, "planner-decode-profile", p.DecodeProfile, "profile of the decode workers when it differs from --planner-profile (same model)")
	fs.StringVar(&p.Codec, "planner-codec", p.Codec, "KV codec the planner models: "+strings.Join(planner.CodecNames(), ", ")+" (empty: --codec, else none)")
	fs.DurationVar(&p.Interval, "planner-interval", p.Interval, "time between re-plans")
	fs.DurationVar(&p.Window, "planner-window", p.Window, "how far back finished requests count for the planner")
	fs.DurationVar(&p.Cooldown, "planner-cooldown", p.Cooldown, "least time between two changes of the desired replicas")
	fs.Float64Var(&p.Headroom, "planner-headroom", p.Headroom, "plan for the observed request rate × (1 + headroom); > 0")
	fs.Float64Var(&p.Hysteresis, "planner-hysteresis", p.Hysteresis, "scale down only to pools that meet the SLO at the observed rate × (1 + headroom + hysteresis); > 0")
	fs.IntVar(&p.MinObservations, "planner-min-observations", p.MinObservations, "fewest finished requests in the window to re-plan on (≥ 2)")
	fs.StringVar(&p.Namespace, "planner-namespace", p.Namespace, "kubernetes planner: namespace of the worker Deployments")
	fs.StringVar(&p.PrefillDeployment, "planner-prefill-deployment", p.PrefillDeployment, "kubernetes planner: name of the prefill worker Deployment")
	fs.StringVar(&p.DecodeDeployment, "planner-decode-deployment", p.DecodeDeployment, "kubernetes planner: name of the decode worker Deployment")
	fs.Float64Var(&p.LinkGbps, "link-gbps", p.LinkGbps, "planner: bandwidth between the pools per worker, each direction, Gb/s")
	fs.Float64Var(&p.GPUCostPerHour, "gpu-cost-per-hour", p.GPUCostPerHour, "planner: USD per GPU-hour, for pdserve_planner_desired_cost_usd_per_hour (0: unknown)")
	fs.IntVar(&p.GPUBudget, "gpu-budget", p.GPUBudget, "planner: most GPUs the prefill and decode pools may use together")
}

// plannerMode returns the planner's effective mode, PlannerAuto resolved,
// and when it is off by PlannerAuto, why.
func (o Options) plannerMode() (mode, why string) {
	if o.Planner.Mode != PlannerAuto {
		return o.Planner.Mode, ""
	}
	switch {
	case o.plannerProfile() == "":
		return PlannerOff, "no --planner-profile (and not standalone with the sim engine)"
	case o.Mode != ModeDisaggregated:
		return PlannerOff, "colocated mode: the planner sizes disaggregated pools"
	case o.Policy.SLO.TTFTMs <= 0 || o.Policy.SLO.TPOTMs <= 0:
		return PlannerOff, "the policy sets no slo.ttft_ms and slo.tpot_ms"
	}
	return PlannerLog, ""
}

// plannerProfile returns the profile the planner uses: --planner-profile,
// else the standalone sim engine's.
func (o Options) plannerProfile() string {
	if o.Planner.Profile == "" && o.Standalone && o.Engine.Engine == enginecfg.Sim {
		return o.Engine.Profile
	}
	return o.Planner.Profile
}

// plannerCodec returns the codec the planner models.
func (o Options) plannerCodec() string {
	switch {
	case o.Planner.Codec != "":
		return o.Planner.Codec
	case o.Codec != "":
		return o.Codec
	}
	return "none"
}

// validatePlanner returns the problems of the planner settings.
func (o Options) validatePlanner() []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	mode, _ := o.plannerMode()
	switch mode {
	case PlannerOff:
		return nil
	case PlannerLog, PlannerKubernetes:
	default:
		bad("planner %q must be %s, %s, %s or %s", o.Planner.Mode, PlannerAuto, PlannerOff, PlannerLog, PlannerKubernetes)
		return errs
	}
	p := o.Planner
	if o.Mode != ModeDisaggregated {
		bad("planner %s: the online planner sizes prefill and decode pools; use --planner=off in %s mode", mode, o.Mode)
	}
	if o.plannerProfile() == "" {
		bad("planner %s needs --planner-profile (standalone with the sim engine: --profile)", mode)
	}
	if o.Policy.SLO.TTFTMs <= 0 || o.Policy.SLO.TPOTMs <= 0 {
		bad("planner %s needs slo.ttft_ms and slo.tpot_ms > 0 in the --config policy", mode)
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
	if mode == PlannerKubernetes && (p.Namespace == "" || p.PrefillDeployment == "" || p.DecodeDeployment == "") {
		bad("planner kubernetes needs --planner-namespace, --planner-prefill-deployment and --planner-decode-deployment")
	}
	if len(errs) > 0 {
		return errs
	}
	// The planner's own checks: profile, codec, link, cost, GPU budget.
	cfg, err := o.onlineConfig()
	if err == nil {
		_, err = planner.NewOnline(cfg, nil)
	}
	if err != nil {
		errs = append(errs, err)
	}
	return errs
}

// plannerLogFields returns the effective planner settings as zap fields.
func (o Options) plannerLogFields() []zap.Field {
	mode, why := o.plannerMode()
	if mode == PlannerOff {
		return []zap.Field{zap.String("planner", mode), zap.String("planner_off_reason", why)}
	}
	p := o.Planner
	f := []zap.Field{
		zap.String("planner", mode),
		zap.String("planner_profile", o.plannerProfile()),
		zap.String("planner_decode_profile", p.DecodeProfile),
		zap.String("planner_codec", o.plannerCodec()),
		zap.Duration("planner_interval", p.Interval),
		zap.Duration("planner_window", p.Window),
		zap.Duration("planner_cooldown", p.Cooldown),
		zap.Float64("planner_headroom", p.Headroom),
		zap.Float64("planner_hysteresis", p.Hysteresis),
		zap.Int("planner_min_observations", p.MinObservations),
		zap.Float64("slo_attainment", o.Policy.SLO.AttainmentOrDefault()),
		zap.Float64("link_gbps", p.LinkGbps),
		zap.Float64("gpu_cost_per_hour", p.GPUCostPerHour),
		zap.Int("gpu_budget", p.GPUBudget),
	}
	if mode == PlannerKubernetes {
		f = append(f, zap.String("planner_namespace", p.Namespace),
			zap.String("planner_prefill_deployment", p.PrefillDeployment),
			zap.String("planner_decode_deployment", p.DecodeDeployment))
	}
	return f
}

// onlineConfig builds the planner's configuration from the options,
// without Publish, Actuator, Current and Log. Errors: an unknown profile
// or codec.
func (o Options) onlineConfig() (planner.OnlineConfig, error) {
	prof, err := perfmodel.Resolve(o.plannerProfile())
	if err != nil {
		return planner.OnlineConfig{}, fmt.Errorf("planner-profile: %w", err)
	}
	var dec *perfmodel.Profile
	if o.Planner.DecodeProfile != "" {
		if dec, err = perfmodel.Resolve(o.Planner.DecodeProfile); err != nil {
			return planner.OnlineConfig{}, fmt.Errorf("planner-decode-profile: %w", err)
		}
		if dec.Model != prof.Model {
			return planner.OnlineConfig{}, fmt.Errorf("planner-decode-profile model %s differs from planner-profile model %s", dec.Model, prof.Model)
		}
	}
	codec, err := planner.CodecByName(o.plannerCodec())
	if err != nil {
		return planner.OnlineConfig{}, fmt.Errorf("planner-codec: %w", err)
	}
	p := o.Planner
	slo := o.Policy.SLO
	return planner.OnlineConfig{
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
			Policy:          planner.Policy(o.FirstTokenPolicy),
			GPUCostPerHour:  p.GPUCostPerHour,
			GPUBudget:       p.GPUBudget,
			Seed:            1,
		},
		Window:          p.Window,
		Interval:        p.Interval,
		Cooldown:        p.Cooldown,
		Headroom:        p.Headroom,
		Hysteresis:      p.Hysteresis,
		MinObservations: p.MinObservations,
	}, nil
}

// onlinePlanner is the coordinator's running planner. A nil
// *onlinePlanner (planner off) observes nothing and runs nothing.
type onlinePlanner struct {
	online *planner.Online
	ticks  <-chan time.Time // nil: a ticker of Interval/10
	every  time.Duration
}

// newPlanner builds the planner of the options, registering its gauges
// on c.reg; nil when it is off. It needs c.nc and c.members. Errors: the
// actuator's (PlannerKubernetes outside a cluster) and registration
// errors.
func (c *Coordinator) newPlanner() (*onlinePlanner, error) {
	mode, why := c.o.plannerMode()
	log := c.log.Named("planner")
	if mode == PlannerOff {
		log.Info("online planner off", zap.String("reason", cmp.Or(why, "--planner=off")))
		return nil, nil
	}
	cfg, err := c.o.onlineConfig()
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	po := c.o.Planner
	switch mode {
	case PlannerKubernetes:
		ko := actuator.KubernetesOptions{Namespace: po.Namespace, PrefillDeployment: po.PrefillDeployment, DecodeDeployment: po.DecodeDeployment}
		var k *actuator.Kubernetes
		if po.KubeClient != nil {
			k, err = actuator.NewKubernetes(po.KubeClient, ko)
		} else {
			k, err = actuator.NewInCluster(ko)
		}
		if err != nil {
			return nil, fmt.Errorf("coordinator: planner: %w", err)
		}
		cfg.Actuator = k
	default:
		cfg.Actuator = actuator.NewLog(log)
	}
	cost := c.costGauge(cfg.Base)
	if cost != nil {
		if err := c.reg.Register(cost); err != nil {
			return nil, fmt.Errorf("coordinator: planner: register metrics: %w", err)
		}
	}
	var online *planner.Online
	// Run calls Publish once per decision, after it set the desired
	// replicas: the place to update the cost of the desired pools too.
	cfg.Publish = func(subject string, data []byte) error {
		if cost != nil {
			p, d := online.Desired()
			tpD := cfg.Base.Prefill.TP
			if cfg.Base.Decode != nil {
				tpD = cfg.Base.Decode.TP
			}
			cost.Set(float64(p*cfg.Base.Prefill.TP+d*tpD) * cfg.Base.GPUCostPerHour)
		}
		return c.nc.Publish(subject, data)
	}
	cfg.Current = func() (prefill, decode int) {
		return len(c.members.Members(control.RolePrefill)), len(c.members.Members(control.RoleDecode))
	}
	cfg.Log = log
	if online, err = planner.NewOnline(cfg, c.reg); err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	log.Info("online planner on", zap.String("actuator", mode), zap.String("profile", cfg.Base.Prefill.Name),
		zap.Duration("interval", cfg.Interval), zap.Duration("window", cfg.Window))
	return &onlinePlanner{online: online, ticks: po.Ticks, every: max(cfg.Interval/10, 10*time.Millisecond)}, nil
}

// costGauge returns the gauge of the desired pools' cost, or nil without
// a GPU price.
func (c *Coordinator) costGauge(base planner.Config) prometheus.Gauge {
	if base.GPUCostPerHour <= 0 {
		return nil
	}
	return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "pdserve", Name: "planner_desired_cost_usd_per_hour",
		Help: "USD per hour of the GPUs of the pools the planner desires (--gpu-cost-per-hour × GPUs)."})
}

// observe returns b, wrapped so that every request it completes is
// observed by the planner; b itself when p is nil.
func (p *onlinePlanner) observe(b frontend.Backend) frontend.Backend {
	if p == nil {
		return b
	}
	return observingBackend{Backend: b, observe: func(t *budget.Trace) { p.online.Observe(planner.ObservationFromTrace(t)) }}
}

// run re-plans until ctx ends; it returns at once when p is nil.
func (p *onlinePlanner) run(ctx context.Context) {
	if p == nil {
		return
	}
	ticks := p.ticks
	if ticks == nil {
		t := time.NewTicker(p.every)
		defer t.Stop()
		ticks = t.C
	}
	_ = p.online.Run(ctx, ticks) // returns nil when ctx ends
}

// Planner returns the online planner, or nil when it is off.
func (c *Coordinator) Planner() *planner.Online {
	if c.planner == nil {
		return nil
	}
	return c.planner.online
}

// observingBackend passes the budget trace of every request its Backend
// completed (finished with stop or length, or stopped by a stop string)
// to observe, before Complete returns: the trace is then final but for
// the status the frontend sets. Failed and cancelled requests are not
// observed.
type observingBackend struct {
	frontend.Backend
	observe func(*budget.Trace)
}

var _ frontend.Backend = observingBackend{}

func (b observingBackend) Complete(ctx context.Context, req *frontend.Request, emit frontend.EmitFunc) ([]string, error) {
	finish, err := b.Backend.Complete(ctx, req, emit)
	if err == nil || errors.Is(err, frontend.ErrStopped) {
		b.observe(req.Trace)
	}
	return finish, err
}
