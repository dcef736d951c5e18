package config

import (
	"fmt"
	"math"
	"slices"
)

// Tier is a model alias clients request (e.g. "chat"), served by an
// ordered list of models: the first whose predicted time to first token
// fits the request's budget, falling back along the list when one is
// down, shedding or predicted over the budget (package tiers).
//
//	tiers:
//	  chat:
//	    models: [llama-3-8b-q4, llama-3-70b]   # fast first, then quality
type Tier struct {
	Models []string `yaml:"models"`
}

// Priorities of a request: interactive requests are admitted up to the
// whole limits.queue_limit, batch requests only up to its
// objectives.batch_share, so under load batch work is refused first
// (429 with Retry-After) and interactive work last.
const (
	PriorityInteractive = "interactive"
	PriorityBatch       = "batch"
)

// Objective is a request's latency objective: its TTFT budget and its
// priority.
type Objective struct {
	// TTFTBudgetMs is the time to first token the request should get, in
	// milliseconds; a tier alias is served by the first model predicted
	// to meet it. 0: no budget (the first live model of a tier).
	TTFTBudgetMs float64 `yaml:"ttft_budget_ms"`
	// Priority is "interactive" (the default) or "batch".
	Priority string `yaml:"priority"`
	// MinTTFTBudgetMs is the tightest budget a request's
	// X-PDServe-TTFT-Budget-Ms header may ask (a tighter one is a 400):
	// a tight budget buys the fast tier. 0: any.
	MinTTFTBudgetMs float64 `yaml:"min_ttft_budget_ms"`
}

// Objectives gives each request its Objective: that of its API key when
// the key is listed (by name with a key file, as prompt_budgets), else
// that of its route, else Default. A request's headers may lower its
// priority and set its budget within the objective's bounds.
//
//	objectives:
//	  default: {ttft_budget_ms: 1000, priority: interactive}
//	  routes:
//	    /v1/completions: {priority: batch}
//	  api_keys:
//	    team-a: {ttft_budget_ms: 300, min_ttft_budget_ms: 200}
//	    nightly: {priority: batch}
//	  batch_share: 0.5   # of limits.queue_limit batch requests may hold
type Objectives struct {
	Default Objective            `yaml:"default"`
	Routes  map[string]Objective `yaml:"routes"`
	APIKeys map[string]Objective `yaml:"api_keys"`
	// BatchShare is the share of limits.queue_limit that batch requests
	// may hold at once, in (0, 1]; 0: DefaultBatchShare.
	BatchShare float64 `yaml:"batch_share"`
}

// DefaultBatchShare is Objectives.BatchShare when the policy sets none.
const DefaultBatchShare = 0.5

// BatchShareOrDefault returns BatchShare, or DefaultBatchShare when 0.
func (o Objectives) BatchShareOrDefault() float64 {
	if o.BatchShare == 0 {
		return DefaultBatchShare
	}
	return o.BatchShare
}

// Objective returns the objective of a request on route whose key is
// named keyName (with a key file; else the key itself, as for
// Budgets.Budget), and the surface it came from ("api key NAME", "route
// …", "default"), with Priority filled in.
func (o Objectives) Objective(route, keyName string, named bool) (Objective, string) {
	obj, surface := o.Default, "default"
	if ob, ok := o.Routes[route]; ok {
		obj, surface = ob, "route "+route
	}
	if keyName != "" {
		if ob, ok := o.APIKeys[keyName]; ok {
			obj, surface = ob, "api key "+keyName
			if !named {
				surface = "api key " + redact("api_keys", keyName)
			}
		}
	}
	if obj.Priority == "" {
		obj.Priority = PriorityInteractive
	}
	return obj, surface
}

func (o Objective) validate(where string) error {
	switch {
	case !(o.TTFTBudgetMs >= 0) || math.IsInf(o.TTFTBudgetMs, 0):
		return fmt.Errorf("%w: %s.ttft_budget_ms must be a finite number ≥ 0, got %v", ErrInvalid, where, o.TTFTBudgetMs)
	case !(o.MinTTFTBudgetMs >= 0) || math.IsInf(o.MinTTFTBudgetMs, 0):
		return fmt.Errorf("%w: %s.min_ttft_budget_ms must be a finite number ≥ 0, got %v", ErrInvalid, where, o.MinTTFTBudgetMs)
	case o.TTFTBudgetMs > 0 && o.TTFTBudgetMs < o.MinTTFTBudgetMs:
		return fmt.Errorf("%w: %s.ttft_budget_ms %v is under its min_ttft_budget_ms %v", ErrInvalid, where, o.TTFTBudgetMs, o.MinTTFTBudgetMs)
	case o.Priority != "" && o.Priority != PriorityInteractive && o.Priority != PriorityBatch:
		return fmt.Errorf("%w: %s.priority must be %q or %q, got %q", ErrInvalid, where, PriorityInteractive, PriorityBatch, o.Priority)
	}
	return nil
}

func (o Objectives) validate() error {
	if !(o.BatchShare >= 0 && o.BatchShare <= 1) {
		return fmt.Errorf("%w: objectives.batch_share must lie in (0, 1] (0: %v), got %v", ErrInvalid, DefaultBatchShare, o.BatchShare)
	}
	if err := o.Default.validate("objectives.default"); err != nil {
		return err
	}
	for _, m := range []struct {
		name string
		m    map[string]Objective
	}{{"routes", o.Routes}, {"api_keys", o.APIKeys}} {
		keys := make([]string, 0, len(m.m))
		for k := range m.m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if k == "" {
				return fmt.Errorf("%w: objectives.%s: an entry has an empty name", ErrInvalid, m.name)
			}
			if err := m.m[k].validate(fmt.Sprintf("objectives.%s[%s]", m.name, redact(m.name, k))); err != nil {
				return err
			}
		}
	}
	return nil
}

func validateTiers(tiers map[string]Tier) error {
	names := make([]string, 0, len(tiers))
	for n := range tiers {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		t := tiers[n]
		if n == "" {
			return fmt.Errorf("%w: tiers: a tier has an empty name", ErrInvalid)
		}
		if len(t.Models) == 0 {
			return fmt.Errorf("%w: tiers.%s.models must list at least one model", ErrInvalid, n)
		}
		for i, m := range t.Models {
			switch {
			case m == "":
				return fmt.Errorf("%w: tiers.%s.models[%d] is empty", ErrInvalid, n, i)
			case slices.Index(t.Models, m) != i:
				return fmt.Errorf("%w: tiers.%s lists model %q twice", ErrInvalid, n, m)
			case m == n:
				return fmt.Errorf("%w: tiers.%s lists itself", ErrInvalid, n)
			}
			if _, alias := tiers[m]; alias {
				return fmt.Errorf("%w: tiers.%s lists %q, which is a tier: a tier lists served models", ErrInvalid, n, m)
			}
		}
	}
	return nil
}
