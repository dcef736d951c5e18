package coordinator

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/router"
	"github.com/pdserve/pdserve/pkg/tiers"
)

// tierChooser is the frontend's Tiers: package tiers' choice over the
// coordinator's view of the workers, learning from every request served.
type tierChooser struct {
	c       *Coordinator
	chooser *tiers.Chooser
	metrics *tiers.Metrics
}

func newTierChooser(c *Coordinator, reg prometheus.Registerer) *tierChooser {
	ch, _ := tiers.New(0) // the default weight is valid
	return &tierChooser{c: c, chooser: ch, metrics: tiers.NewMetrics(reg)}
}

// live is model's state from the admitted, non-draining workers: up when
// it has a worker of every role a request needs (prefill and decode, or
// colocated in colocated mode), shedding when every worker that would
// prefill it is at the routing policy's max_queued_prefill_tokens. Queued
// prefill tokens are the router's estimates: a worker's heartbeat plus
// what was routed to it since (router.Loads), so that a burst between two
// heartbeats counts against the model it went to.
func (t *tierChooser) live(model string) tiers.Live {
	b := t.c.backend
	prefillRole, decodeRole := control.RolePrefill, control.RoleDecode
	if t.c.o.Mode == ModeColocated {
		prefillRole, decodeRole = control.RoleColocated, control.RoleColocated
	}
	serves := func(w router.Worker) bool {
		if t.c.o.ModelName != "" { // every worker serves under --model-name
			return model == t.c.o.ModelName
		}
		return w.Model == model
	}
	decode := 0
	for _, w := range b.workers(decodeRole) {
		if serves(w) {
			decode++
		}
	}
	var prefill []router.Worker
	for _, w := range b.workers(prefillRole) {
		if serves(w) {
			prefill = append(prefill, w)
		}
	}
	var l tiers.Live
	loads := b.router.Loads(prefill)
	limit := t.c.o.Policy.Routing.MaxQueuedPrefillTokens
	full := 0
	for i, w := range prefill {
		q := loads[w.ID].QueuedPrefillTokens
		if i == 0 || q < l.QueuedPrefillTokens {
			l.QueuedPrefillTokens = q
		}
		if limit > 0 && q >= limit {
			full++
		}
	}
	l.Up = len(prefill) > 0 && decode > 0
	l.Shedding = l.Up && full == len(prefill)
	return l
}

func (t *tierChooser) Choose(tier string, models []string, promptTokens int, ttftBudget time.Duration) (tiers.Choice, error) {
	ch, err := t.chooser.Choose(models, promptTokens, ttftBudget, t.live)
	if err == nil {
		t.metrics.Chose(tier, ch)
	}
	return ch, err
}

// Observe learns from a request that got its first token, and counts a
// tier's request against its budget.
func (t *tierChooser) Observe(tr *budget.Trace) {
	if tr.FirstToken.IsZero() || tr.Model == "" {
		return
	}
	s := tr.Terms()
	t.chooser.Observe(tr.Model, tiers.Sample{
		UncachedTokens: tr.PromptTokens - tr.PrefixHitTokens, PromptTokens: tr.PromptTokens,
		TTFT: s.TTFT, Queue: s.Queue, Prefill: s.Prefill, KVTransfer: s.KVTransfer,
	})
	if tr.Objective.Tier != "" {
		t.metrics.Served(tr.Objective.Tier, tr.Model, s.TTFT, tr.Objective.TTFTBudget)
	}
}
