package frontend

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/tiers"
	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// chooserTiers is a Tiers over a real tiers.Chooser with every model up.
type chooserTiers struct{ c *tiers.Chooser }

func (t chooserTiers) Choose(_ string, models []string, promptTokens int, left time.Duration) (tiers.Choice, error) {
	return t.c.Choose(models, promptTokens, left, func(string) tiers.Live { return tiers.Live{Up: true} })
}

func (chooserTiers) Observe(*budget.Trace) {}

// slowTokenizer advances the clock by d each time it encodes: the time a
// request spends at the coordinator before its model is chosen.
type slowTokenizer struct {
	engine.Tokenizer
	clock *fakeClock
	d     time.Duration
}

func (s slowTokenizer) Encode(text string) []int32 {
	s.clock.Advance(s.d)
	return s.Tokenizer.Encode(text)
}

// TestTierChoiceUsesBudgetLeft: a tier's model is chosen against what is
// left of the request's TTFT budget when it is chosen, not the whole
// budget: with 200 ms of budget, a first model predicted at 150 ms serves
// a request that arrives with its budget whole, but one that spent 80 ms
// at the coordinator falls back to the 50 ms model, and one whose budget
// is spent gets the fastest. Before, the whole 200 ms was weighed and the
// 150 ms model served all three.
func TestTierChoiceUsesBudgetLeft(t *testing.T) {
	ch, err := tiers.New(1)
	if err != nil {
		t.Fatal(err)
	}
	// 100-token prompts: big 1.5 ms a token (150 ms), small 0.5 ms (50 ms).
	for m, perToken := range map[string]time.Duration{"big": 1500 * time.Microsecond, "small": 500 * time.Microsecond} {
		ch.Observe(m, tiers.Sample{UncachedTokens: 100, PromptTokens: 100, TTFT: 100 * perToken, Prefill: 100 * perToken})
	}
	body := `{"model":"chat","prompt":"` + strings.Repeat("a", 100) + `","max_tokens":1}`
	for _, tc := range []struct {
		name       string
		spent      time.Duration
		model, why string
	}{
		{"budget whole", 0, "big", ""},
		{"80 ms spent here", 80 * time.Millisecond, "small", tiers.ReasonOverBudget},
		{"budget spent", 250 * time.Millisecond, "small", tiers.ReasonOverBudget},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
			ts := newTestServer(t, &fakeBackend{complete: echoText("ok")}, func(o *Options) {
				o.Now = clock.Now
				o.Tokenizer = slowTokenizer{Tokenizer: tokenizer.Bytes{}, clock: clock, d: tc.spent}
				o.Models = func() []Model { return []Model{{Name: "big", MaxModelLen: 1024}, {Name: "small", MaxModelLen: 1024}} }
				o.Policy.Tiers = map[string]config.Tier{"chat": {Models: []string{"big", "small"}}}
				o.Tiers = chooserTiers{ch}
			})
			resp := ts.post(t, RouteCompletions, body, HeaderTTFTBudget, "200")
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %v", resp.StatusCode, errorBody(t, resp))
			}
			got := decodeJSON(t, resp.Body)
			b := got["pdserve"].(map[string]any)
			why, _ := b["tier_fallback"].(string)
			if got["model"] != tc.model || why != tc.why || b["tier"] != "chat" {
				t.Errorf("served by %v (fallback %q, tier %v), want %s (fallback %q)", got["model"], why, b["tier"], tc.model, tc.why)
			}
		})
	}
}
