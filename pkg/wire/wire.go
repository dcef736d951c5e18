package wire

import (
	"fmt"
	"math"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/grammar"
)

// MaxGrammarBytes bounds the GBNF text a request carries: pkg/grammar's
// bound, which the frontend refuses with a 400 before a request is sent.
const MaxGrammarBytes = grammar.MaxBytes

// maxPenalty bounds presence_penalty and frequency_penalty (OpenAI's range).
const maxPenalty = 2

// Sampling returns the message of s (its penalties' weights, not counts).
func Sampling(s engine.Sampling) *pdservev1.Sampling {
	m := &pdservev1.Sampling{Temperature: s.Temperature, TopP: s.TopP, Seed: s.Seed, Grammar: s.Grammar}
	if p := s.Penalties; p != nil {
		m.PresencePenalty, m.FrequencyPenalty = p.Presence, p.Frequency
	}
	return m
}

// FromSampling validates m and returns its engine form, with fresh
// (empty) penalty counts when a penalty is set, and its grammar's text
// (no Constraint: the worker builds it). Errors name the bad field.
func FromSampling(m *pdservev1.Sampling) (engine.Sampling, error) {
	t, top := m.GetTemperature(), m.GetTopP()
	if t < 0 || math.IsNaN(float64(t)) || math.IsInf(float64(t), 0) {
		return engine.Sampling{}, fmt.Errorf("temperature %v must be a finite number >= 0", t)
	}
	if top < 0 || top > 1 || math.IsNaN(float64(top)) {
		return engine.Sampling{}, fmt.Errorf("top_p %v must lie in [0, 1]", top)
	}
	if n := len(m.GetGrammar()); n > MaxGrammarBytes {
		return engine.Sampling{}, fmt.Errorf("grammar of %d bytes is over the limit of %d", n, MaxGrammarBytes)
	}
	s := engine.Sampling{Temperature: t, TopP: top, Seed: m.GetSeed(), Grammar: m.GetGrammar()}
	pp, fp := m.GetPresencePenalty(), m.GetFrequencyPenalty()
	for _, v := range []struct {
		name string
		v    float32
	}{{"presence_penalty", pp}, {"frequency_penalty", fp}} {
		if !(v.v >= -maxPenalty && v.v <= maxPenalty) {
			return engine.Sampling{}, fmt.Errorf("%s %v must lie in [-2, 2]", v.name, v.v)
		}
	}
	if pp != 0 || fp != 0 {
		s.Penalties = &engine.Penalties{Presence: pp, Frequency: fp}
	}
	return s, nil
}

// Logprobs returns the request message asking for top alternatives, or
// nil when top < 0 (none asked).
func Logprobs(top int) *pdservev1.Logprobs {
	if top < 0 {
		return nil
	}
	return &pdservev1.Logprobs{Enabled: true, Top: int32(top)}
}

// FromLogprobs returns the number of alternatives m asks for, or -1 when
// it asks for none. Errors: top outside [0, engine.MaxTopLogprobs].
func FromLogprobs(m *pdservev1.Logprobs) (int, error) {
	if !m.GetEnabled() {
		return -1, nil
	}
	if t := m.GetTop(); t < 0 || t > engine.MaxTopLogprobs {
		return 0, fmt.Errorf("top logprobs %d outside [0, %d]", t, engine.MaxTopLogprobs)
	}
	return int(m.GetTop()), nil
}

// TokenLogprob returns the message of lp.
func TokenLogprob(lp engine.TokenLogprob) *pdservev1.TokenLogprob {
	m := &pdservev1.TokenLogprob{Token: lp.Token, Logprob: lp.Logprob}
	if len(lp.Top) > 0 {
		m.Top = make([]*pdservev1.TokenProb, len(lp.Top))
		for i, t := range lp.Top {
			m.Top[i] = &pdservev1.TokenProb{Token: t.Token, Logprob: t.Logprob}
		}
	}
	return m
}

// TokenLogprobs returns the messages of lps (nil for none).
func TokenLogprobs(lps []engine.TokenLogprob) []*pdservev1.TokenLogprob {
	if len(lps) == 0 {
		return nil
	}
	out := make([]*pdservev1.TokenLogprob, len(lps))
	for i, lp := range lps {
		out[i] = TokenLogprob(lp)
	}
	return out
}

// FromTokenLogprob returns the engine form of m (the zero value for nil).
func FromTokenLogprob(m *pdservev1.TokenLogprob) engine.TokenLogprob {
	lp := engine.TokenLogprob{Token: m.GetToken(), Logprob: m.GetLogprob()}
	if len(m.GetTop()) > 0 {
		lp.Top = make([]engine.TokenProb, len(m.GetTop()))
		for i, t := range m.GetTop() {
			lp.Top[i] = engine.TokenProb{Token: t.GetToken(), Logprob: t.GetLogprob()}
		}
	}
	return lp
}

// FromTokenLogprobs returns the engine form of ms (nil for none).
func FromTokenLogprobs(ms []*pdservev1.TokenLogprob) []engine.TokenLogprob {
	if len(ms) == 0 {
		return nil
	}
	out := make([]engine.TokenLogprob, len(ms))
	for i, m := range ms {
		out[i] = FromTokenLogprob(m)
	}
	return out
}

// OutputLogprob returns the log-probability of token sampled from logits
// at position pos, with top alternatives: engine.Logprob of the raw
// logits, or engine.StandInLogprob when the engine computes no logits
// (sim: deterministic stand-ins, not probabilities).
func OutputLogprob(logits []float32, token int32, pos, top, vocab int) engine.TokenLogprob {
	if logits == nil {
		return engine.StandInLogprob(token, pos, top, vocab)
	}
	return engine.Logprob(logits, token, top)
}
