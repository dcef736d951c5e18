// Package tiers chooses which served model answers a request that names a
// tier alias (config.Tier): the first model of the tier's ordered list
// whose predicted time to first token fits the request's TTFT budget.
//
// # The prediction
//
// A Chooser learns, per model, from the budgets of the requests that
// model completed (Observe): its prefill rate (uncached prompt tokens per
// second of prefill), its KV transfer time per prompt token, and the rest
// of TTFT (routing, the first decode step). For a prompt of p tokens on a
// model whose least-loaded prefill worker has q tokens queued (from the
// workers' heartbeats, Live), the predicted TTFT is
//
//	queue q/rate + prefill p/rate + KV transfer p × kv + rest
//
// each term an exponentially weighted mean (weight Alpha for the newest
// sample). The prefix cache is not counted (the prediction is the cold
// case). A model with no completed request yet has no prediction and is
// taken as fitting, so a new model is tried.
//
// # The choice
//
// Choose walks the tier's models in order and passes over one that is
// down (no admitted, non-draining worker of a role it needs), shedding
// (every prefill worker at its queue limit) or predicted over the budget,
// recording why. The first it does not pass over serves. When every live
// model is predicted over the budget, the one predicted fastest serves
// (Choice.Fits false); when none is live, ErrNoModel.
//
// The budget is what is left of the request's TTFT budget when its model
// is chosen (budget.Trace.BudgetLeft: less the client's network round
// trip and the time already spent at the coordinator), the same rule
// region placement uses: a client whose round trip eats part of its
// budget falls back to a faster model. A budget already spent fits no
// measured model, so the fastest serves.
//
// The Chooser's state is behind one mutex; Choose and Observe may be
// called from any goroutine.
package tiers

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Reasons a model of a tier was passed over.
const (
	ReasonDown       = "down"
	ReasonShedding   = "shedding"
	ReasonOverBudget = "over_budget"
)

// ErrNoModel is returned by Choose when no model of the tier is live.
var ErrNoModel = errors.New("tiers: no model of the tier is served now")

// Live is a served model's state now, from the workers' heartbeats.
type Live struct {
	// Up is whether the model has an admitted, non-draining worker of
	// every role a request needs.
	Up bool
	// Shedding is whether every worker that would prefill its requests is
	// at its queue limit.
	Shedding bool
	// QueuedPrefillTokens is the fewest prompt tokens queued on one of
	// its prefill (or, colocated, its) workers.
	QueuedPrefillTokens int
}

// Prediction is a model's predicted TTFT for one prompt, by term.
type Prediction struct {
	Queue, Prefill, KVTransfer, Rest time.Duration
	// Measured is false while the model has completed no request: the
	// terms are zero and the model is taken as fitting.
	Measured bool
}

// TTFT is the sum of the terms.
func (p Prediction) TTFT() time.Duration { return p.Queue + p.Prefill + p.KVTransfer + p.Rest }

// Skip is a model Choose passed over, and why.
type Skip struct {
	Model, Reason string
	// Predicted is the model's prediction when Reason is ReasonOverBudget.
	Predicted time.Duration
}

// Choice is the model Choose picked.
type Choice struct {
	Model string
	// Index is its position in the tier (0: the first).
	Index     int
	Predicted Prediction
	// Fits is whether it is predicted within the budget (or there is no
	// budget, or it is unmeasured).
	Fits bool
	// Skipped are the models before it that were passed over, in order.
	Skipped []Skip
}

// Fallback is why the tier's first model did not serve: the reason it was
// passed over, or "" when it serves.
func (c Choice) Fallback() string {
	if c.Index == 0 || len(c.Skipped) == 0 {
		return ""
	}
	return c.Skipped[0].Reason
}

// Sample is what a completed request tells about its model's TTFT.
type Sample struct {
	// UncachedTokens are the prompt tokens prefilled (prompt less the
	// prefix-cache hit).
	UncachedTokens int
	// PromptTokens are the prompt's tokens (the KV transferred covers
	// them, less what the decode worker held).
	PromptTokens                     int
	TTFT, Queue, Prefill, KVTransfer time.Duration
}

// DefaultAlpha is the weight of the newest sample in the means.
const DefaultAlpha = 0.2

// Chooser predicts models' TTFT from what they served and picks a tier's
// model. The zero value is not usable; call New.
type Chooser struct {
	alpha float64
	mu    sync.Mutex
	est   map[string]*estimate
}

// estimate is one model's learnt terms.
type estimate struct {
	secPerToken   float64 // prefill seconds per uncached prompt token
	kvSecPerToken float64 // KV transfer seconds per prompt token
	restSec       float64 // TTFT − queue − prefill − KV transfer
	rateSamples   int
	samples       int
}

// New returns a Chooser whose means weigh the newest sample alpha, in
// (0, 1]; 0: DefaultAlpha.
func New(alpha float64) (*Chooser, error) {
	if alpha == 0 {
		alpha = DefaultAlpha
	}
	if !(alpha > 0 && alpha <= 1) {
		return nil, fmt.Errorf("tiers: alpha must lie in (0, 1], got %v", alpha)
	}
	return &Chooser{alpha: alpha, est: map[string]*estimate{}}, nil
}

// Observe learns from a request model completed with its first token. A
// sample without a first token (TTFT 0) is ignored.
func (c *Chooser) Observe(model string, s Sample) {
	if s.TTFT <= 0 || model == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.est[model]
	if e == nil {
		e = &estimate{}
		c.est[model] = e
	}
	mean := func(old *float64, v float64, n int) {
		if n == 0 {
			*old = v
			return
		}
		*old += c.alpha * (v - *old)
	}
	if s.UncachedTokens > 0 && s.Prefill > 0 {
		mean(&e.secPerToken, s.Prefill.Seconds()/float64(s.UncachedTokens), e.rateSamples)
		e.rateSamples++
	}
	if s.PromptTokens > 0 {
		mean(&e.kvSecPerToken, s.KVTransfer.Seconds()/float64(s.PromptTokens), e.samples)
	}
	rest := s.TTFT - s.Queue - s.Prefill - s.KVTransfer
	mean(&e.restSec, max(rest, 0).Seconds(), e.samples)
	e.samples++
}

// Predict returns model's predicted TTFT for a prompt of promptTokens with
// the model in state live.
func (c *Chooser) Predict(model string, promptTokens int, live Live) Prediction {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.est[model]
	if e == nil || e.samples == 0 {
		return Prediction{}
	}
	return Terms{PrefillSecPerToken: e.secPerToken, KVSecPerToken: e.kvSecPerToken, RestSec: e.restSec}.Predict(promptTokens, live.QueuedPrefillTokens)
}

// Choose picks the model of models (a tier's, in order) that serves a
// prompt of promptTokens with budget left of its TTFT budget (0: the
// request has none; negative: it is spent, so no measured model fits and
// the one predicted fastest serves), given each model's state from live.
// See the package doc for the rule.
func (c *Chooser) Choose(models []string, promptTokens int, budget time.Duration, live func(model string) Live) (Choice, error) {
	var skipped []Skip
	best := -1
	var bestPred Prediction
	for i, m := range models {
		l := live(m)
		switch {
		case !l.Up:
			skipped = append(skipped, Skip{Model: m, Reason: ReasonDown})
			continue
		case l.Shedding:
			skipped = append(skipped, Skip{Model: m, Reason: ReasonShedding})
			continue
		}
		p := c.Predict(m, promptTokens, l)
		if budget == 0 || !p.Measured || p.TTFT() <= budget {
			return Choice{Model: m, Index: i, Predicted: p, Fits: true, Skipped: skipped}, nil
		}
		skipped = append(skipped, Skip{Model: m, Reason: ReasonOverBudget, Predicted: p.TTFT()})
		if best < 0 || p.TTFT() < bestPred.TTFT() {
			best, bestPred = i, p
		}
	}
	if best < 0 {
		return Choice{Skipped: skipped}, ErrNoModel
	}
	// Every live model is over the budget: the fastest serves. The skips
	// before it stay its fallback's reasons.
	var before []Skip
	for _, s := range skipped {
		if s.Model == models[best] {
			break
		}
		before = append(before, s)
	}
	return Choice{Model: models[best], Index: best, Predicted: bestPred, Skipped: before}, nil
}

// Metrics are the per-tier series: requests by served model, fallbacks
// by the model passed over and why, and TTFT against the budget.
type Metrics struct {
	requests  *prometheus.CounterVec
	fallbacks *prometheus.CounterVec
	budget    *prometheus.CounterVec
}

// NewMetrics registers the tier metrics on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	return &Metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{Name: "pdserve_tier_requests_total",
			Help: "Requests that named a tier alias, by tier and the model chosen to serve them."}, []string{"tier", "model"}),
		fallbacks: f.NewCounterVec(prometheus.CounterOpts{Name: "pdserve_tier_fallbacks_total",
			Help: "Models of a tier passed over for a request, by tier, the model passed over and why (down, shedding, over_budget)."}, []string{"tier", "model", "reason"}),
		budget: f.NewCounterVec(prometheus.CounterOpts{Name: "pdserve_tier_ttft_budget_total",
			Help: "Requests of a tier with a TTFT budget that got their first token, by tier, model and outcome (within or over the budget)."}, []string{"tier", "model", "outcome"}),
	}
}

// Chose counts a choice for tier.
func (m *Metrics) Chose(tier string, c Choice) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(tier, c.Model).Inc()
	for _, s := range c.Skipped {
		m.fallbacks.WithLabelValues(tier, s.Model, s.Reason).Inc()
	}
}

// Served counts a request of tier served by model with its first token
// after ttft, against its budget (none: not counted).
func (m *Metrics) Served(tier, model string, ttft, budget time.Duration) {
	if m == nil || budget <= 0 || ttft <= 0 {
		return
	}
	outcome := "within"
	if ttft > budget {
		outcome = "over"
	}
	m.budget.WithLabelValues(tier, model, outcome).Inc()
}

// Terms are a model's learnt TTFT terms, per token where they scale with
// the prompt: what Predict computes a prediction from, so that another
// process (a peer region's coordinator) can predict the model's TTFT for
// a prompt of its own.
type Terms struct {
	PrefillSecPerToken float64 `json:"prefill_sec_per_token"`
	KVSecPerToken      float64 `json:"kv_sec_per_token"`
	RestSec            float64 `json:"rest_sec"`
}

// Predict returns the prediction of the terms for a prompt of
// promptTokens with queued tokens in front of it, as Chooser.Predict.
func (t Terms) Predict(promptTokens, queued int) Prediction {
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	return Prediction{
		Queue:      sec(float64(queued) * t.PrefillSecPerToken),
		Prefill:    sec(float64(promptTokens) * t.PrefillSecPerToken),
		KVTransfer: sec(float64(promptTokens) * t.KVSecPerToken),
		Rest:       sec(t.RestSec),
		Measured:   true,
	}
}

// Terms returns model's learnt terms, false while it has served nothing.
func (c *Chooser) Terms(model string) (Terms, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.est[model]
	if e == nil || e.samples == 0 {
		return Terms{}, false
	}
	return Terms{PrefillSecPerToken: e.secPerToken, KVSecPerToken: e.kvSecPerToken, RestSec: e.restSec}, true
}
