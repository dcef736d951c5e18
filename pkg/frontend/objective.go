package frontend

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/tiers"
)

// The request headers of a latency objective (config.Objectives): a TTFT
// budget in milliseconds, at least the min_ttft_budget_ms of the
// request's objective, and a priority, no higher than the objective's (a
// batch key cannot ask interactive).
const (
	HeaderTTFTBudget = "X-PDServe-TTFT-Budget-Ms"
	HeaderPriority   = "X-PDServe-Priority"
)

// maxTTFTBudgetMs bounds the header's budget: an hour.
const maxTTFTBudgetMs = 3600e3

// Tiers chooses the model that serves a request naming a tier alias
// (package tiers, behind the coordinator's view of the workers), and
// learns from the requests served.
type Tiers interface {
	// Choose picks one of models (tier's, in order) for a prompt of
	// promptTokens with budget left of the request's TTFT budget (0: it
	// has none; negative: it is spent; see tiers.Chooser.Choose);
	// tiers.ErrNoModel when none is live.
	Choose(tier string, models []string, promptTokens int, budget time.Duration) (tiers.Choice, error)
	// Observe learns from a finished request (any, tier or not).
	Observe(tr *budget.Trace)
}

// objective returns the latency objective of a request on route from the
// policy and its headers; Priority "" when neither the policy nor the
// headers give one (nothing changes for the request then).
func (s *Server) objective(r *http.Request, cl client, route string) (budget.Objective, *apiError) {
	pol := s.o.Policy.Objectives
	name, named := cl.keyName()
	obj, surface := pol.Objective(route, name, named)
	hb, hp := r.Header.Get(HeaderTTFTBudget), r.Header.Get(HeaderPriority)
	configured := len(s.o.Policy.Tiers) > 0 || pol.Default != (config.Objective{}) || len(pol.Routes) > 0 || len(pol.APIKeys) > 0
	if !configured && hb == "" && hp == "" {
		return budget.Objective{}, nil
	}
	out := budget.Objective{Priority: obj.Priority, TTFTBudget: msDuration(obj.TTFTBudgetMs)}
	if hb != "" {
		v, err := strconv.ParseFloat(strings.TrimSpace(hb), 64)
		if err != nil || !(v > 0) || v > maxTTFTBudgetMs || math.IsInf(v, 0) {
			return out, badRequest(HeaderTTFTBudget, "invalid_value", "%s must be a number of milliseconds in (0, %g], got %q", HeaderTTFTBudget, float64(maxTTFTBudgetMs), hb)
		}
		// A forwarded budget is what the origin left of one it checked
		// against its own minimum: no minimum applies to it here.
		if v < obj.MinTTFTBudgetMs && cl.fwd == nil {
			return out, badRequest(HeaderTTFTBudget, "ttft_budget_below_minimum", "%s %g is under the %g ms that %s allows", HeaderTTFTBudget, v, obj.MinTTFTBudgetMs, surface)
		}
		out.TTFTBudget = msDuration(v)
	}
	switch strings.ToLower(strings.TrimSpace(hp)) {
	case "":
	case config.PriorityBatch:
		out.Priority = config.PriorityBatch
	case config.PriorityInteractive:
		if obj.Priority == config.PriorityBatch {
			return out, badRequest(HeaderPriority, "priority_not_allowed", "%s interactive is above the batch priority of %s", HeaderPriority, surface)
		}
	default:
		return out, badRequest(HeaderPriority, "invalid_value", "%s must be %q or %q, got %q", HeaderPriority, config.PriorityInteractive, config.PriorityBatch, hp)
	}
	return out, nil
}

func msDuration(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// batchLimit is the number of in-flight slots batch requests may hold: the
// policy's share of MaxInFlight, at least 1; 0 without a MaxInFlight.
func (s *Server) batchLimit() int {
	if s.o.MaxInFlight <= 0 {
		return 0
	}
	return max(1, int(float64(s.o.MaxInFlight)*s.o.Policy.Objectives.BatchShareOrDefault()))
}

// batchFull is the 429 of a batch request over the batch share.
func (s *Server) batchFull() *apiError {
	return overloaded("batch requests hold their %d of the server's %d slots; retry later", s.batchLimit(), s.o.MaxInFlight)
}

// chooseTier resolves the tier alias tier for the request traced by tr
// (its prompt tokens counted, its objective set): the model that serves,
// with the choice recorded in tr. The models are weighed against what is
// left of the budget now (the client's round trip and the time spent here
// taken off), as region placement weighs them.
func (s *Server) chooseTier(tier string, models []string, tr *budget.Trace) (string, *apiError) {
	left, ok := tr.BudgetLeft(s.o.Now())
	if ok && left <= 0 {
		left = -1 // spent: not "no budget"
	}
	ch, err := s.o.Tiers.Choose(tier, models, tr.PromptTokens, left)
	tr.Objective.Tier = tier
	if err != nil {
		if errors.Is(err, tiers.ErrNoModel) {
			return "", &apiError{status: http.StatusServiceUnavailable, Message: "No model of tier `" + tier + "` is served now; retry later.",
				Type: "service_unavailable", Param: ptr("model"), Code: ptr("no_workers"), cause: err}
		}
		return "", &apiError{status: http.StatusInternalServerError, Message: "The tier's model could not be chosen.", Type: "server_error", cause: err}
	}
	tr.Objective.TierFallback = ch.Fallback()
	tr.Objective.TierPassed = nil
	for _, sk := range ch.Skipped {
		tr.Objective.TierPassed = append(tr.Objective.TierPassed, sk.Model)
	}
	tr.Objective.PredictedTTFT = ch.Predicted.TTFT()
	return ch.Model, nil
}
