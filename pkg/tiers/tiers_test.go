package tiers

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func newChooser(t *testing.T) *Chooser {
	t.Helper()
	c, err := New(1) // the newest sample only: exact predictions
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A model's prediction is built from what it served: prefill seconds per
// uncached token (also pricing its queue), KV seconds per prompt token and
// the rest.
func TestPredict(t *testing.T) {
	c := newChooser(t)
	if p := c.Predict("m", 100, Live{Up: true}); p.Measured || p.TTFT() != 0 {
		t.Fatalf("unmeasured model: %+v", p)
	}
	// 1,000 tokens, 200 of them cached: 800 prefilled in 80 ms (0.1 ms a
	// token); 20 ms of KV for 1,000 tokens; TTFT 150 ms with 30 ms queued:
	// 20 ms of rest.
	c.Observe("m", Sample{UncachedTokens: 800, PromptTokens: 1000, TTFT: 150 * time.Millisecond,
		Queue: 30 * time.Millisecond, Prefill: 80 * time.Millisecond, KVTransfer: 20 * time.Millisecond})
	p := c.Predict("m", 500, Live{Up: true, QueuedPrefillTokens: 2000})
	want := Prediction{Queue: 200 * time.Millisecond, Prefill: 50 * time.Millisecond, KVTransfer: 10 * time.Millisecond, Rest: 20 * time.Millisecond, Measured: true}
	if p != want {
		t.Errorf("prediction %+v, want %+v", p, want)
	}
	if p.TTFT() != 280*time.Millisecond {
		t.Errorf("TTFT %v, want 280ms", p.TTFT())
	}
	// A request without a first token teaches nothing.
	c.Observe("m", Sample{UncachedTokens: 1, PromptTokens: 1, Prefill: time.Hour})
	if got := c.Predict("m", 500, Live{Up: true, QueuedPrefillTokens: 2000}); got != want {
		t.Errorf("after a sample without a first token: %+v", got)
	}
}

func TestAlphaMeans(t *testing.T) {
	c, err := New(0.5)
	if err != nil {
		t.Fatal(err)
	}
	for _, ms := range []int{10, 30} {
		d := time.Duration(ms) * time.Millisecond
		c.Observe("m", Sample{UncachedTokens: 10, PromptTokens: 10, TTFT: d, Prefill: d})
	}
	// (10 + 30) / 2 over 10 tokens: 2 ms a token.
	if got := c.Predict("m", 10, Live{Up: true}).Prefill; got != 20*time.Millisecond {
		t.Errorf("prefill %v, want 20ms (the mean of 10 and 30)", got)
	}
	for _, a := range []float64{-0.1, 1.5} {
		if _, err := New(a); err == nil {
			t.Errorf("New(%v): no error", a)
		}
	}
}

// The first model that is up, not shedding and predicted within budget
// serves; each one passed over is recorded with its reason.
func TestChoose(t *testing.T) {
	c := newChooser(t)
	obs := func(m string, perToken time.Duration) {
		c.Observe(m, Sample{UncachedTokens: 100, PromptTokens: 100, TTFT: 100 * perToken, Prefill: 100 * perToken})
	}
	obs("fast", time.Millisecond)    // 1 ms a token
	obs("big", 2*time.Millisecond)   // 2 ms a token
	obs("spare", 3*time.Millisecond) // 3 ms a token
	tier := []string{"fast", "big", "spare"}
	state := map[string]Live{"fast": {Up: true}, "big": {Up: true}, "spare": {Up: true}}
	live := func(m string) Live { return state[m] }
	const prompt = 100

	ch, err := c.Choose(tier, prompt, 150*time.Millisecond, live)
	if err != nil || ch.Model != "fast" || !ch.Fits || ch.Fallback() != "" {
		t.Fatalf("idle: %+v, %v; want fast within budget", ch, err)
	}
	// fast's queue: 200 tokens ahead = 200 ms more, over the 250 ms budget;
	// big's 200 ms fits.
	state["fast"] = Live{Up: true, QueuedPrefillTokens: 200}
	ch, err = c.Choose(tier, prompt, 250*time.Millisecond, live)
	if err != nil || ch.Model != "big" || !ch.Fits || ch.Fallback() != ReasonOverBudget || ch.Skipped[0].Predicted != 300*time.Millisecond {
		t.Fatalf("fast queued: %+v, %v; want big after fast over budget (300ms)", ch, err)
	}
	// No budget: the first live model, whatever its queue.
	if ch, _ = c.Choose(tier, prompt, 0, live); ch.Model != "fast" {
		t.Errorf("no budget: %s, want fast", ch.Model)
	}
	state["fast"] = Live{}
	state["big"] = Live{Up: true, Shedding: true}
	ch, err = c.Choose(tier, prompt, time.Second, live)
	if err != nil || ch.Model != "spare" || ch.Fallback() != ReasonDown || len(ch.Skipped) != 2 || ch.Skipped[1].Reason != ReasonShedding {
		t.Fatalf("fast down, big shedding: %+v, %v", ch, err)
	}
	// Every live model over the budget: the fastest serves, not fitting.
	state["fast"] = Live{Up: true, QueuedPrefillTokens: 1000} // 1,100 ms
	state["big"] = Live{Up: true}                             // 200 ms
	ch, err = c.Choose(tier, prompt, 50*time.Millisecond, live)
	if err != nil || ch.Model != "big" || ch.Fits || ch.Fallback() != ReasonOverBudget {
		t.Fatalf("all over budget: %+v, %v; want big, not fitting", ch, err)
	}
	// A spent budget (negative: nothing left of it) fits no measured
	// model: the fastest serves, as when every model is over; before,
	// it was taken as no budget and the first live model served.
	ch, err = c.Choose(tier, prompt, -time.Millisecond, live)
	if err != nil || ch.Model != "big" || ch.Fits {
		t.Fatalf("budget spent: %+v, %v; want big (the fastest), not fitting", ch, err)
	}
	// Nothing live.
	for m := range state {
		state[m] = Live{}
	}
	if _, err := c.Choose(tier, prompt, 0, live); !errors.Is(err, ErrNoModel) {
		t.Errorf("nothing live: %v, want ErrNoModel", err)
	}
	// An unmeasured model is tried.
	state["new"] = Live{Up: true}
	if ch, err = c.Choose([]string{"new"}, prompt, time.Millisecond, live); err != nil || ch.Model != "new" || !ch.Fits {
		t.Errorf("unmeasured: %+v, %v", ch, err)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	m.Chose("chat", Choice{Model: "big", Index: 1, Skipped: []Skip{{Model: "fast", Reason: ReasonOverBudget}}})
	m.Served("chat", "big", 90*time.Millisecond, 100*time.Millisecond)
	m.Served("chat", "big", 110*time.Millisecond, 100*time.Millisecond)
	m.Served("chat", "big", 110*time.Millisecond, 0) // no budget: not counted
	want := `
# HELP pdserve_tier_fallbacks_total Models of a tier passed over for a request, by tier, the model passed over and why (down, shedding, over_budget).
# TYPE pdserve_tier_fallbacks_total counter
pdserve_tier_fallbacks_total{model="fast",reason="over_budget",tier="chat"} 1
# HELP pdserve_tier_requests_total Requests that named a tier alias, by tier and the model chosen to serve them.
# TYPE pdserve_tier_requests_total counter
pdserve_tier_requests_total{model="big",tier="chat"} 1
# HELP pdserve_tier_ttft_budget_total Requests of a tier with a TTFT budget that got their first token, by tier, model and outcome (within or over the budget).
# TYPE pdserve_tier_ttft_budget_total counter
pdserve_tier_ttft_budget_total{model="big",outcome="over",tier="chat"} 1
pdserve_tier_ttft_budget_total{model="big",outcome="within",tier="chat"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
