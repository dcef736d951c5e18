package planner

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/perfmodel"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// Observation is one finished request as the coordinator measured it.
type Observation struct {
	// Model is the served model that answered the request (budget.Trace's
	// Model; for a tier alias, the tier's model that served it).
	Model        string
	Arrival      time.Time
	PromptTokens int // ≥ 1
	OutputTokens int // ≥ 1
	// Disaggregated: prefilled on a prefill worker, KV sent to a decode
	// worker (false for local prefill and colocated requests, whose step
	// times do not correct the prefill and transfer terms).
	Disaggregated bool
	// Prefill is the prefill step time (PrefillEnd − PrefillStart) and
	// PrefillBatch the requests in that step (≥ 1; 0 means 1).
	Prefill      time.Duration
	PrefillBatch int
	// TPOT is the request's time per output token and DecodeBatch the
	// (largest) decode batch it was part of (0 means 1).
	TPOT        time.Duration
	DecodeBatch int
	// KVStream is the whole KV transfer (KVDone − KVFirstByte) and
	// KVTransfer its part not hidden behind prefill (KVDone − PrefillEnd);
	// KVBytesRaw the raw KV bytes moved (0: computed from the profile).
	KVStream, KVTransfer time.Duration
	KVBytesRaw           int64
	// FirstTokenPolicy is "prefill" or "decode" ("" means the Online's
	// configured policy).
	FirstTokenPolicy string
	// TTFT is the request's time to first token (0: unknown), for the
	// measured attainment of role moves.
	TTFT time.Duration
	// Refused: the pools refused the request for want of room (429), so
	// it is demand only, as Demand's, and a miss of the measured
	// attainment. Its OutputTokens is its max_tokens, which a tick caps
	// at the longest output served in its window (a max_tokens left to
	// its default can be the whole context).
	Refused bool
	// TermsOnly: a served retry of a request already observed as Refused
	// (its client's retry of the 429). Its measured terms correct the
	// model; it is neither demand again (the rate and the workload) nor an
	// attainment sample (its refusal was the miss).
	TermsOnly bool
}

// RefusedObservation returns the observation of a request of model the
// pools refused for want of room: arrival, prompt tokens and max_tokens.
func RefusedObservation(model string, arrival time.Time, promptTokens, maxTokens int) Observation {
	return Observation{Model: model, Arrival: arrival, PromptTokens: promptTokens, OutputTokens: maxTokens, Refused: true}
}

// Demand returns ob as demand only, of model: a request that asked for
// model first and was served by another (a tier's fallback). It has
// ob's arrival and lengths, which size the workload the planner plans
// for, and no measured term: the corrections and the measured attainment
// read only the served model's own observations.
func (ob Observation) Demand(model string) Observation {
	return Observation{Model: model, Arrival: ob.Arrival, PromptTokens: ob.PromptTokens, OutputTokens: ob.OutputTokens}
}

// ObservationFromTrace returns the observation of a finished request's
// budget trace. The trace is only read.
func ObservationFromTrace(t *budget.Trace) Observation {
	terms := t.Terms()
	return Observation{
		Model:            t.Model,
		Arrival:          t.Arrival,
		PromptTokens:     t.PromptTokens,
		OutputTokens:     t.OutputTokens,
		Disaggregated:    t.Mode == vocab.ModeDisaggregated,
		Prefill:          terms.Prefill,
		PrefillBatch:     t.PrefillBatch,
		TPOT:             terms.TPOT,
		DecodeBatch:      t.BatchSize,
		KVStream:         terms.KVStream,
		KVTransfer:       terms.KVTransfer,
		KVBytesRaw:       t.KVBytesRaw,
		FirstTokenPolicy: t.FirstTokenPolicy,
		TTFT:             terms.TTFT,
	}
}

// Actuator applies desired replica counts (see package planner/actuator).
type Actuator interface {
	// Scale sets the prefill and decode pools to these replica counts.
	Scale(ctx context.Context, prefill, decode int) error
}

// OnlineConfig configures NewOnline. Zero durations and factors take the
// defaults in brackets.
type OnlineConfig struct {
	// Model, when set, is the served model whose pools this Online sizes
	// (one Online per model of the policy's tiers): it is named in every
	// Decision. The caller hands it only that model's observations.
	Model string
	// Base is the planning config: profiles, SLO, link, codec, policy,
	// costs, GPU budget, limits, seed. Its Workload, Rate and Scale are
	// replaced by what is observed; Requests 0 means 400 here.
	Base Config
	// Window is how far back observations count [5m].
	Window time.Duration
	// Interval is the time between re-plans [30s].
	Interval time.Duration
	// Cooldown is the least time between two changes of the desired
	// replicas [5m].
	Cooldown time.Duration
	// Headroom: plan for the observed rate × (1 + Headroom) [0.2].
	Headroom float64
	// Hysteresis: scale down only to a design that also meets the SLO at
	// the observed rate × (1 + Headroom + Hysteresis) [0.15].
	Hysteresis float64
	// MinObservations: no re-plan with fewer in the window [50].
	MinObservations int
	// Stabilization is how many consecutive re-plans must ask for the same
	// new design before the desired replicas change [2], so that a window
	// still filling with a new rate does not step through intermediate
	// designs.
	Stabilization int

	// Publish, when set, is called by Run with control.PlanSubject and
	// every decision as JSON (nats.Conn.Publish fits).
	Publish func(subject string, data []byte) error
	// Actuator, when set, is called by Run when the desired replicas
	// change.
	Actuator Actuator
	// Current, when set, is called by Run before every Tick for the live
	// replica counts (e.g. from control.Membership).
	Current func() (prefill, decode int)
	// Log receives Run's errors and decisions; nil means no logging.
	Log *zap.Logger
	// Roles moves live workers between the pools (elastic workers)
	// before the total changes; RoleActuator, when set, is called by Run
	// for each move.
	Roles        RoleOptions
	RoleActuator RoleActuator
}

// Decision is the result of one re-plan. It is the JSON payload published
// on control.PlanSubject.
type Decision struct {
	Time time.Time `json:"time"`
	// Model is the served model whose pools the decision sizes
	// (OnlineConfig.Model); omitted when the planner sizes the one pair of
	// pools of every model.
	Model string `json:"model,omitempty"`
	// PrefillReplicas and DecodeReplicas are the desired replicas after
	// this decision; Previous* before it; Current* the live ones.
	PrefillReplicas  int     `json:"prefill_replicas"`
	DecodeReplicas   int     `json:"decode_replicas"`
	PreviousPrefill  int     `json:"previous_prefill_replicas"`
	PreviousDecode   int     `json:"previous_decode_replicas"`
	CurrentPrefill   int     `json:"current_prefill_replicas"`
	CurrentDecode    int     `json:"current_decode_replicas"`
	GPUs             int     `json:"gpus"`
	TargetPrefill    int     `json:"target_prefill_replicas"` // what the plan alone asks for
	TargetDecode     int     `json:"target_decode_replicas"`
	Changed          bool    `json:"changed"`
	Reason           string  `json:"reason"`
	ObservedRate     float64 `json:"observed_rate"` // requests/s over the window
	PlannedRate      float64 `json:"planned_rate"`  // with headroom
	Burstiness       float64 `json:"burstiness"`
	Observations     int     `json:"observations"`
	Scale            Scale   `json:"model_correction"`
	Attainment       float64 `json:"predicted_attainment"` // of the desired design at the planned rate
	PredictedTTFTMs  float64 `json:"predicted_ttft_ms"`    // at the attainment percentile
	PredictedTPOTMs  float64 `json:"predicted_tpot_ms"`
	FirstTokenPolicy Policy  `json:"first_token_policy"`
	// Warnings: the observed workload leaves the range the profiles were
	// measured over (as Plan.Warnings), at the desired design.
	Warnings []string `json:"warnings,omitempty"`
	// Roles is the decision on the live workers' roles (with
	// OnlineConfig.Roles; nil without it or before the pools are known).
	// A move sets the desired replicas to the split after it, with
	// Changed false: Changed reports a change of the total, which the
	// actuator scales; with role moves on, a target of the same total is
	// left to them (Reason "roles").
	Roles *RoleDecision `json:"roles,omitempty"`
}

// Reasons a Decision gives.
const (
	ReasonInitial    = "initial"
	ReasonUnchanged  = "unchanged"
	ReasonScaleUp    = "scale up"
	ReasonScaleDown  = "scale down"
	ReasonCooldown   = "cooldown"
	ReasonHysteresis = "hysteresis"
	ReasonStabilize  = "stabilizing" // the new design has not been asked for long enough
	ReasonSaturated  = "saturated"   // nothing within the budget meets the SLO: the largest design
	ReasonRoles      = "roles"       // role moves change the split at the same total
)

// Online re-plans the pools from observed traffic. Observe, SetCurrent
// and Tick are safe for concurrent use; Tick runs simulations (tens to
// hundreds of milliseconds) and should run on its own goroutine, as Run
// does.
type Online struct {
	cfg OnlineConfig

	mu         sync.Mutex
	obs        []Observation // by arrival
	last       time.Time     // last re-plan
	lastChange time.Time
	curP, curD int
	desP, desD int
	planning   sync.Mutex // one Tick plans at a time
	// the last target and how many consecutive re-plans asked for it;
	// guarded by planning
	lastTarget Design
	streak     int
	// lastMove is the time of the last role move and effect the move
	// whose measured effect is due one window after it; guarded by
	// planning.
	lastMove time.Time
	effect   *RoleEffect

	replicas *prometheus.GaugeVec
	rate     prometheus.Gauge
	scale    *prometheus.GaugeVec
	// role moves
	moves      *prometheus.CounterVec
	roleAttain *prometheus.GaugeVec
}

// NewOnline returns an Online with cfg, registering its gauges on reg
// (nil: none): pdserve_pool_replicas{role="prefill|decode",
// kind="desired|current"}, pdserve_planner_observed_rate (requests/s) and
// pdserve_planner_model_correction{term="prefill|decode|transfer"}.
// Errors: ErrConfig for a bad Base or negative settings, or the
// registration error.
func NewOnline(cfg OnlineConfig, reg prometheus.Registerer) (*Online, error) {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.Window, 5*time.Minute)
	def(&cfg.Interval, 30*time.Second)
	def(&cfg.Cooldown, 5*time.Minute)
	if cfg.Headroom == 0 {
		cfg.Headroom = 0.2
	}
	if cfg.Hysteresis == 0 {
		cfg.Hysteresis = 0.15
	}
	if cfg.MinObservations == 0 {
		cfg.MinObservations = 50
	}
	if cfg.Stabilization == 0 {
		cfg.Stabilization = 2
	}
	if cfg.Base.Requests == 0 {
		cfg.Base.Requests = 400
	}
	if cfg.Roles.Enabled {
		if err := cfg.Roles.defaults(); err != nil {
			return nil, err
		}
	}
	if cfg.Window < 0 || cfg.Interval < 0 || cfg.Cooldown < 0 || !(cfg.Headroom >= 0) || !(cfg.Hysteresis >= 0) || cfg.MinObservations < 2 || cfg.Stabilization < 1 {
		return nil, fmt.Errorf("%w: online window, interval, cooldown, headroom and hysteresis must be ≥ 0, min observations ≥ 2, stabilization ≥ 1", ErrConfig)
	}
	base := cfg.Base
	base.Workload = Fixed(1, 1)
	if err := base.Validate(); err != nil {
		return nil, err
	}
	o := &Online{cfg: cfg}
	o.replicas = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "pdserve", Name: "pool_replicas",
		Help: "Replicas of a worker pool: desired by the planner or current (live workers)."}, []string{"role", "kind"})
	o.rate = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "pdserve", Name: "planner_observed_rate",
		Help: "Request rate the planner observed over its window, requests per second."})
	o.scale = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "pdserve", Name: "planner_model_correction",
		Help: "Observed over predicted time of a model term, by which the planner corrects the performance model."}, []string{"term"})
	o.moves = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "pdserve", Name: "planner_role_moves_total",
		Help: "Workers the planner moved between roles, by old and new role."}, []string{"from", "to"})
	o.roleAttain = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "pdserve", Name: "planner_role_attainment",
		Help: "SLO attainment around role moves: predicted for the current and the best split (kind=predicted_before|predicted_after), measured over the window (measured), and measured over the window before and after the last move (effect_before|effect_after)."}, []string{"kind"})
	if reg != nil {
		for _, c := range []prometheus.Collector{o.replicas, o.rate, o.scale, o.moves, o.roleAttain} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("planner: register metrics: %w", err)
			}
		}
	}
	return o, nil
}

// Observe adds a finished request to the window. Observations with no
// arrival time or lengths < 1 are ignored.
func (o *Online) Observe(ob Observation) {
	if ob.Arrival.IsZero() || ob.PromptTokens < 1 || ob.OutputTokens < 1 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	// Requests finish out of arrival order; keep the slice sorted.
	i := len(o.obs)
	for i > 0 && o.obs[i-1].Arrival.After(ob.Arrival) {
		i--
	}
	o.obs = slices.Insert(o.obs, i, ob)
}

// SetCurrent records the live replica counts (gauge kind="current"). Until
// the first decision, they are also the desired ones that hysteresis and
// cooldown compare against.
func (o *Online) SetCurrent(prefill, decode int) {
	o.mu.Lock()
	o.curP, o.curD = prefill, decode
	o.mu.Unlock()
	o.replicas.WithLabelValues("prefill", "current").Set(float64(prefill))
	o.replicas.WithLabelValues("decode", "current").Set(float64(decode))
}

// Desired returns the desired replicas (0, 0 before the first decision).
func (o *Online) Desired() (prefill, decode int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.desP, o.desD
}

// Tick re-plans when Interval has passed since the last re-plan and the
// window holds at least MinObservations, and returns the decision and
// true; otherwise false. now is the time of the call (observations older
// than now − Window are dropped). The plan's target is the disaggregated
// design with the fewest GPUs that meets the SLO at the observed rate ×
// (1 + Headroom), on the model corrected by the observations. The
// decision changes the desired replicas only when the target differs from
// them, the cooldown since the last change has passed, the last
// Stabilization re-plans asked for the same target and, to scale down,
// the smaller design also meets the SLO with the extra Hysteresis margin.
// The first decision sets the desired replicas to the target (or keeps
// the current ones, given by SetCurrent, if the target equals them).
func (o *Online) Tick(now time.Time) (Decision, bool) {
	o.planning.Lock()
	defer o.planning.Unlock()
	o.mu.Lock()
	if !o.last.IsZero() && now.Sub(o.last) < o.cfg.Interval {
		o.mu.Unlock()
		return Decision{}, false
	}
	from := now.Add(-o.cfg.Window)
	k, _ := slices.BinarySearchFunc(o.obs, from, func(ob Observation, t time.Time) int { return ob.Arrival.Compare(t) })
	o.obs = slices.Delete(o.obs, 0, k)
	obs := slices.Clone(o.obs)
	curP, curD, desP, desD, lastChange := o.curP, o.curD, o.desP, o.desD, o.lastChange
	if len(obs) >= o.cfg.MinObservations {
		o.last = now
	}
	o.mu.Unlock()
	if len(obs) < o.cfg.MinObservations {
		return Decision{}, false
	}

	capRefused(obs)
	cfg := o.cfg.Base
	w, rate := observedWorkload(obs, from, now)
	cfg.Workload = w
	cfg.Scale = o.corrections(obs)
	planned := rate * (1 + o.cfg.Headroom)
	cfg.Rate = planned
	s := newSearcher(&cfg)
	d := Decision{
		Time: now, Model: o.cfg.Model, CurrentPrefill: curP, CurrentDecode: curD, PreviousPrefill: desP, PreviousDecode: desD,
		ObservedRate: rate, PlannedRate: planned, Burstiness: w.Burstiness, Observations: len(obs),
		Scale: cfg.Scale, FirstTokenPolicy: cfg.policy(),
	}
	target, ok := s.smallestMeeting(planned)
	if !ok {
		target = s.largest()
		d.Reason = ReasonSaturated
	}
	d.TargetPrefill, d.TargetDecode = target.Prefill, target.Decode
	if target == o.lastTarget {
		o.streak++
	} else {
		o.lastTarget, o.streak = target, 1
	}
	if desP == 0 && desD == 0 && curP > 0 && curD > 0 {
		desP, desD = curP, curD // first decision: compare with what runs
	}
	var rd *RoleDecision
	if o.cfg.Roles.Enabled && curP > 0 && curD > 0 {
		r := s.planRoles(o.cfg.Roles, curP, curD, planned, now, o.lastMove)
		r.Measured = measuredAttainment(obs, cfg.SLO)
		if e := o.effect; e != nil && now.Sub(e.Moved) >= o.cfg.Window {
			e.AfterMeasured, r.Effect, o.effect = r.Measured, e, nil
			o.roleAttain.WithLabelValues("effect_before").Set(e.BeforeMeasured)
			o.roleAttain.WithLabelValues("effect_after").Set(e.AfterMeasured)
		}
		if r.Changed {
			o.moves.WithLabelValues(r.From, r.To).Add(float64(r.Moved))
			o.lastMove = now
			o.effect = &RoleEffect{Moved: now, From: r.From, To: r.To, N: r.Moved, BeforeMeasured: r.Measured, Predicted: r.PredictedGain}
		}
		o.roleAttain.WithLabelValues("predicted_before").Set(r.PredictedBefore)
		o.roleAttain.WithLabelValues("predicted_after").Set(r.PredictedAfter)
		o.roleAttain.WithLabelValues("measured").Set(r.Measured)
		rd, d.Roles = &r, &r
	}
	next := Design{Prefill: desP, Decode: desD}
	switch {
	case desP == 0 || desD == 0:
		next, d.Reason = target, cmp.Or(d.Reason, ReasonInitial)
	case rd != nil && rd.Changed:
		next, d.Reason = Design{Prefill: rd.Prefill, Decode: rd.Decode}, ReasonRoles
	case rd != nil && target.Prefill+target.Decode == next.Prefill+next.Decode && target != next:
		d.Reason = ReasonRoles
	case target == next:
		d.Reason = cmp.Or(d.Reason, ReasonUnchanged)
	case !lastChange.IsZero() && now.Sub(lastChange) < o.cfg.Cooldown:
		d.Reason = ReasonCooldown
	case o.streak < o.cfg.Stabilization:
		d.Reason = ReasonStabilize
	case target.Prefill <= desP && target.Decode <= desD:
		if s.meets(target, rate*(1+o.cfg.Headroom+o.cfg.Hysteresis)) {
			next, d.Reason = target, ReasonScaleDown
		} else {
			d.Reason = ReasonHysteresis
		}
	default:
		next, d.Reason = target, cmp.Or(d.Reason, ReasonScaleUp)
	}
	d.PrefillReplicas, d.DecodeReplicas = next.Prefill, next.Decode
	d.GPUs = s.gpus(next)
	d.Changed = next != Design{Prefill: desP, Decode: desD} && (rd == nil || !rd.Changed)
	r := s.sim.run(next, planned, false)
	d.Attainment = r.Attainment
	d.PredictedTTFTMs, d.PredictedTPOTMs = ms(r.TTFT.At), ms(r.TPOT.At)
	d.Warnings, _ = rangeWarnings(&cfg, s.sim.st, nil, &Prediction{Steps: r.Steps}, nil, true, false)

	o.mu.Lock()
	if d.Changed || (o.desP == 0 && o.desD == 0) || (rd != nil && rd.Changed) {
		if d.Changed {
			o.lastChange = now
		}
		o.desP, o.desD = next.Prefill, next.Decode
	}
	o.mu.Unlock()
	o.replicas.WithLabelValues("prefill", "desired").Set(float64(next.Prefill))
	o.replicas.WithLabelValues("decode", "desired").Set(float64(next.Decode))
	o.rate.Set(rate)
	o.scale.WithLabelValues("prefill").Set(cfg.Scale.get(cfg.Scale.Prefill))
	o.scale.WithLabelValues("decode").Set(cfg.Scale.get(cfg.Scale.Decode))
	o.scale.WithLabelValues("transfer").Set(cfg.Scale.get(cfg.Scale.Transfer))
	return d, true
}

// Run calls Tick on every tick until ctx is done, publishing every
// decision on control.PlanSubject and calling the actuator when the
// desired replicas change. Errors of Publish and the actuator are logged,
// not returned (the next change retries the actuator). It returns nil
// when ctx is done.
func (o *Online) Run(ctx context.Context, ticks <-chan time.Time) error {
	log := o.cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	var warned []string // the warnings last logged, to log each change once
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-ticks:
			if o.cfg.Current != nil {
				o.SetCurrent(o.cfg.Current())
			}
			d, ok := o.Tick(now)
			if !ok {
				continue
			}
			log.Info("planner decision", zap.Int("prefill", d.PrefillReplicas), zap.Int("decode", d.DecodeReplicas),
				zap.Bool("changed", d.Changed), zap.String("reason", d.Reason), zap.Float64("observed_rate", d.ObservedRate),
				zap.Int("observations", d.Observations))
			if len(d.Warnings) > 0 && !slices.Equal(d.Warnings, warned) {
				log.Warn("planner: the workload leaves the profile's measured range", zap.Strings("warnings", d.Warnings))
			}
			warned = d.Warnings
			if o.cfg.Publish != nil {
				data, err := json.Marshal(d)
				if err == nil {
					err = o.cfg.Publish(control.PlanSubject, data)
				}
				if err != nil {
					log.Warn("planner: publish decision", zap.Error(err))
				}
			}
			if r := d.Roles; r != nil {
				f := []zap.Field{zap.Bool("changed", r.Changed), zap.String("reason", r.Reason), zap.Int("prefill", r.Prefill), zap.Int("decode", r.Decode),
					zap.Float64("predicted_before", r.PredictedBefore), zap.Float64("predicted_after", r.PredictedAfter),
					zap.Float64("predicted_gain", r.PredictedGain), zap.Float64("measured_attainment", r.Measured)}
				if r.Changed {
					f = append(f, zap.Int("moved", r.Moved), zap.String("from", r.From), zap.String("to", r.To))
				}
				if e := r.Effect; e != nil {
					f = append(f, zap.Time("effect_of_move_at", e.Moved), zap.Float64("effect_measured_before", e.BeforeMeasured), zap.Float64("effect_measured_after", e.AfterMeasured))
				}
				log.Info("planner role decision", f...)
				if r.Changed {
					if o.cfg.RoleActuator != nil {
						if err := o.cfg.RoleActuator.MoveRoles(ctx, r.From, r.To, r.Moved); err != nil && !errors.Is(err, context.Canceled) {
							log.Warn("planner: move roles", zap.Error(err))
						}
					}
				}
			}
			if d.Changed && o.cfg.Actuator != nil {
				if err := o.cfg.Actuator.Scale(ctx, d.PrefillReplicas, d.DecodeReplicas); err != nil && !errors.Is(err, context.Canceled) {
					log.Warn("planner: scale pools", zap.Error(err))
				}
			}
		}
	}
}

// observedWorkload builds the workload of the window [from, now] and its
// rate, requests/s, from the observations that are demand (all but
// TermsOnly ones; all of them when none is).
func observedWorkload(obs []Observation, from, now time.Time) (*Workload, float64) {
	if demand := slices.DeleteFunc(slices.Clone(obs), func(ob Observation) bool { return ob.TermsOnly }); len(demand) > 0 {
		obs = demand
	}
	w := &Workload{Lengths: make([]Lengths, len(obs))}
	for i, ob := range obs {
		w.Lengths[i] = Lengths{In: ob.PromptTokens, Out: ob.OutputTokens}
	}
	start := from
	if obs[0].Arrival.After(from) {
		start = obs[0].Arrival
	}
	span := now.Sub(start).Seconds()
	rate := float64(len(obs)) / max(span, 1e-3)
	gaps := make([]float64, len(obs)-1)
	for i := 1; i < len(obs); i++ {
		gaps[i-1] = obs[i].Arrival.Sub(obs[i-1].Arrival).Seconds()
	}
	w.Burstiness = min(max(burstinessOf(gaps), 0.05), 20)
	w.Rate = rate
	w.Description = fmt.Sprintf("observed: %d requests, %.3g req/s", len(obs), rate)
	return w, rate
}

// Bounds of a model correction factor.
const (
	minCorrection     = 0.25
	maxCorrection     = 4
	minCorrectSamples = 10
)

// corrections returns the median observed/predicted ratios of prefill
// step time, decode step time and KV stream time over the observations of
// disaggregated requests (1 for a term with fewer than 10 samples),
// clamped to [0.25, 4]. Predictions take the observation's own batch size
// (its prefill batch of equal prompts; its decode batch at its mean
// context) and, for the stream, its measured prefill time; a stream
// counts only when the modelled link time exceeds the prefill time it
// overlaps (otherwise the link's speed is not visible in it).
func (o *Online) corrections(obs []Observation) Scale {
	base := &o.cfg.Base
	pp, dp := base.Prefill, base.decodeProfile()
	rawRate := base.Codec.rawRate(base.LinkBytesPerSec, base.codecCores())
	layers := float64(pp.Spec.Layers)
	var pr, dr, tr []float64
	batch := make([]int, 0, 64)
	for _, ob := range obs {
		if !ob.Disaggregated {
			continue
		}
		if ob.Prefill > 0 {
			batch = batch[:0]
			for range max(ob.PrefillBatch, 1) {
				batch = append(batch, ob.PromptTokens)
			}
			if pred := pp.StepSeconds(perfmodel.Batch{Prefill: batch}); pred > 0 {
				pr = append(pr, ob.Prefill.Seconds()/pred)
			}
		}
		if ob.OutputTokens > 2 && ob.TPOT > 0 {
			step := ob.TPOT.Seconds()
			policy := Policy(ob.FirstTokenPolicy)
			if policy == "" {
				policy = base.policy()
			}
			if policy == PolicyPrefill { // the first gap holds the exposed transfer
				step = max(step-ob.KVTransfer.Seconds()/float64(ob.OutputTokens-1), 0)
			}
			batch = batch[:0]
			for range max(ob.DecodeBatch, 1) {
				batch = append(batch, ob.PromptTokens+ob.OutputTokens/2)
			}
			if pred := dp.StepSeconds(perfmodel.Batch{Decode: batch}); pred > 0 && step > 0 {
				dr = append(dr, step/pred)
			}
		}
		if ob.KVStream > 0 {
			raw := float64(ob.KVBytesRaw)
			if raw <= 0 {
				raw = float64(ob.PromptTokens) * float64(pp.KVBytesPerToken())
			}
			// The stream shows the link's speed only when the link, not
			// the prefill producing layers, sets its pace.
			total := raw / rawRate
			if hidden := ob.Prefill.Seconds() * (1 - 1/layers); total > hidden {
				tr = append(tr, ob.KVStream.Seconds()/max(total, hidden+total/layers))
			}
		}
	}
	return Scale{Prefill: medianFactor(pr), Decode: medianFactor(dr), Transfer: medianFactor(tr)}
}

// capRefused caps the output of each refused observation (its
// max_tokens) at the longest output served among obs, when one was.
func capRefused(obs []Observation) {
	longest := 0
	for _, ob := range obs {
		if !ob.Refused {
			longest = max(longest, ob.OutputTokens)
		}
	}
	if longest == 0 {
		return
	}
	for i := range obs {
		if obs[i].Refused {
			obs[i].OutputTokens = min(obs[i].OutputTokens, longest)
		}
	}
}

func medianFactor(xs []float64) float64 {
	if len(xs) < minCorrectSamples {
		return 1
	}
	slices.Sort(xs)
	m := xs[len(xs)/2]
	if len(xs)%2 == 0 {
		m = (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	return min(max(m, minCorrection), maxCorrection)
}

// smallestMeeting returns the disaggregated design with the fewest GPUs
// (then the largest capacity bound) that meets the target at rate.
func (s *searcher) smallestMeeting(rate float64) (Design, bool) {
	var cands []Candidate
	tpP, tpD := s.cfg.Prefill.Units(), s.cfg.decodeProfile().Units()
	for p := 1; p*tpP+tpD <= s.cfg.GPUBudget; p++ {
		for d := 1; p*tpP+d*tpD <= s.cfg.GPUBudget; d++ {
			des := Design{Prefill: p, Decode: d}
			if b := s.bound(des); b >= rate {
				cands = append(cands, Candidate{Design: des, GPUs: s.gpus(des), Bound: b, Skipped: true})
			}
		}
	}
	c, ok := s.atRate(cands, rate)
	return c.Design, ok
}

// largest returns the design within the budget with the largest capacity
// bound (ties: fewer GPUs).
func (s *searcher) largest() Design {
	best, bestB, bestG := Design{Prefill: 1, Decode: 1}, -1.0, math.MaxInt
	tpP, tpD := s.cfg.Prefill.Units(), s.cfg.decodeProfile().Units()
	for p := 1; p*tpP+tpD <= s.cfg.GPUBudget; p++ {
		for d := 1; p*tpP+d*tpD <= s.cfg.GPUBudget; d++ {
			des := Design{Prefill: p, Decode: d}
			if b, g := s.bound(des), s.gpus(des); b > bestB || (b == bestB && g < bestG) {
				best, bestB, bestG = des, b, g
			}
		}
	}
	return best
}
