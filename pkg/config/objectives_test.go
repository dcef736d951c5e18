package config

import (
	"errors"
	"strings"
	"testing"
)

func TestTiersAndObjectives(t *testing.T) {
	p, err := Parse([]byte(`
tiers:
  chat: {models: [small, big]}
objectives:
  default: {ttft_budget_ms: 800}
  routes:
    /v1/completions: {priority: batch}
  api_keys:
    team-a: {ttft_budget_ms: 300, min_ttft_budget_ms: 100}
  batch_share: 0.25
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Tiers["chat"].Models; len(got) != 2 || got[0] != "small" {
		t.Errorf("tier chat: %v", got)
	}
	if p.Objectives.BatchShareOrDefault() != 0.25 || (Objectives{}).BatchShareOrDefault() != DefaultBatchShare {
		t.Error("batch share")
	}
	for _, tc := range []struct {
		route, key        string
		budget            float64
		priority, surface string
	}{
		{"/v1/chat/completions", "", 800, PriorityInteractive, "default"},
		{"/v1/completions", "", 0, PriorityBatch, "route /v1/completions"},
		{"/v1/completions", "team-a", 300, PriorityInteractive, "api key team-a"},
		{"/v1/chat/completions", "team-b", 800, PriorityInteractive, "default"},
	} {
		o, s := p.Objectives.Objective(tc.route, tc.key, true)
		if o.TTFTBudgetMs != tc.budget || o.Priority != tc.priority || s != tc.surface {
			t.Errorf("%s %q: %+v from %s, want %v %s from %s", tc.route, tc.key, o, s, tc.budget, tc.priority, tc.surface)
		}
	}
	for _, bad := range []string{
		"tiers: {chat: {models: []}}",
		"tiers: {chat: {models: [a, a]}}",
		"tiers: {chat: {models: [chat]}}",
		"tiers: {chat: {models: [fast]}, fast: {models: [x]}}",
		"objectives: {default: {priority: urgent}}",
		"objectives: {default: {ttft_budget_ms: -1}}",
		"objectives: {default: {ttft_budget_ms: .inf}}",
		"objectives: {api_keys: {k: {ttft_budget_ms: 50, min_ttft_budget_ms: 100}}}",
		"objectives: {batch_share: 1.5}",
	} {
		if _, err := Parse([]byte(bad)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", bad, err)
		} else if !strings.Contains(err.Error(), "tiers") && !strings.Contains(err.Error(), "objectives") {
			t.Errorf("%s: %v does not name the section", bad, err)
		}
	}
}
