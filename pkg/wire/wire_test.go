package wire

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
)

func TestSamplingRoundTrip(t *testing.T) {
	for _, s := range []engine.Sampling{
		{},
		{Temperature: 0.7, TopP: 0.9, Seed: 11},
		{Temperature: 1, Penalties: &engine.Penalties{Presence: 0.5, Frequency: -1.25}},
	} {
		got, err := FromSampling(Sampling(s))
		if err != nil {
			t.Fatalf("%+v: %v", s, err)
		}
		if diff := cmp.Diff(s, got); diff != "" {
			t.Errorf("round trip (-sent +received):\n%s", diff)
		}
	}
}

func TestFromSamplingRejects(t *testing.T) {
	for _, m := range []*pdservev1.Sampling{
		{Temperature: -1},
		{Temperature: float32(math.Inf(1))},
		{TopP: 1.5},
		{PresencePenalty: 2.5},
		{FrequencyPenalty: float32(math.NaN())},
	} {
		if _, err := FromSampling(m); err == nil {
			t.Errorf("%v: accepted", m)
		}
	}
}

func TestLogprobs(t *testing.T) {
	for _, top := range []int{-1, 0, 3, engine.MaxTopLogprobs} {
		got, err := FromLogprobs(Logprobs(top))
		if err != nil || got != top {
			t.Errorf("top %d: round trip %d, %v", top, got, err)
		}
	}
	if _, err := FromLogprobs(&pdservev1.Logprobs{Enabled: true, Top: engine.MaxTopLogprobs + 1}); err == nil {
		t.Error("21 alternatives accepted")
	}
	lps := []engine.TokenLogprob{
		{Token: 3, Logprob: -0.5, Top: []engine.TokenProb{{Token: 3, Logprob: -0.5}, {Token: 9, Logprob: -1.5}}},
		{Token: 4, Logprob: -2},
	}
	if diff := cmp.Diff(lps, FromTokenLogprobs(TokenLogprobs(lps))); diff != "" {
		t.Errorf("token logprobs round trip (-sent +received):\n%s", diff)
	}
	if FromTokenLogprobs(TokenLogprobs(nil)) != nil {
		t.Error("no logprobs became some")
	}
}

func TestOutputLogprob(t *testing.T) {
	logits := []float32{0, 1, 2}
	if got, want := OutputLogprob(logits, 2, 5, 1, 3), engine.Logprob(logits, 2, 1); !cmp.Equal(got, want) {
		t.Errorf("with logits: %+v, want %+v", got, want)
	}
	if got, want := OutputLogprob(nil, 2, 5, 2, 3), engine.StandInLogprob(2, 5, 2, 3); !cmp.Equal(got, want) {
		t.Errorf("without logits: %+v, want the stand-in %+v", got, want)
	}
}
