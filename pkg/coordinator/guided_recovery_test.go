package coordinator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/llamacpp"
	"github.com/pdserve/pdserve/pkg/enginebuild"
	"github.com/pdserve/pdserve/pkg/grammar"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// guidedSchema bounds every sentence (an enum, a 16-digit integer at
// most, a boolean), so random weights end their output.
const guidedSchema = `{"type":"object","properties":{"city":{"enum":["Zürich","Lisbon","Osaka"]},"n":{"type":"integer"},"ok":{"type":"boolean"}},"required":["city","n","ok"],"additionalProperties":false}`

// generateGuided is reference.generate under gbnf: the engine alone, its
// grammar state advanced over every token, until end of generation.
func (r *reference) generateGuided(t *testing.T, prompt []int32, maxTokens int, s engine.Sampling, gbnf string) []int32 {
	t.Helper()
	st, err := grammar.ForEngine(r.eng).Constrain(gbnf, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s.Constraint = st
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	seq := r.seq
	defer r.eng.Free(seq)
	ctx := context.Background()
	out, err := r.eng.Prefill(ctx, []engine.PrefillItem{{Seq: seq, Tokens: prompt, Sampling: s, Last: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	eos := r.eng.Tokenizer().EOS()
	var toks []int32
	for tok := out[0].Token; ; {
		if err := st.Accept(tok); err != nil {
			t.Fatalf("reference: token %d against the grammar: %v", tok, err)
		}
		if tok == eos {
			return toks
		}
		if toks = append(toks, tok); len(toks) == maxTokens {
			t.Fatalf("reference: no end of generation in %d tokens: %q", maxTokens, r.eng.Tokenizer().Decode(toks))
		}
		o, err := r.eng.Decode(ctx, []engine.DecodeItem{{Seq: seq, Token: tok, Sampling: s}})
		if err != nil {
			t.Fatal(err)
		}
		tok = o[0].Token
	}
}

// openGuided starts a streaming completion of body and reads events
// until it has at least min tokens; the caller owns the response.
func openGuided(ctx context.Context, t *testing.T, url string, body map[string]any, min int) (*http.Response, []int32) {
	t.Helper()
	body["stream"], body["return_token_ids"] = true, true
	resp := post(ctx, t, url+"/v1/completions", body)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var toks []int32
	var buf []byte
	one := make([]byte, 1)
	for len(toks) < min {
		buf = buf[:0]
		for !strings.HasSuffix(string(buf), "\n\n") {
			if _, err := resp.Body.Read(one); err != nil {
				t.Fatalf("reading stream after %d tokens: %v", len(toks), err)
			}
			buf = append(buf, one[0])
		}
		var ch struct {
			Choices []struct {
				TokenIDs []int32 `json:"token_ids"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(strings.TrimPrefix(strings.TrimSpace(string(buf)), "data: ")), &ch); err != nil {
			t.Fatalf("event %q: %v", buf, err)
		}
		for _, c := range ch.Choices {
			toks = append(toks, c.TokenIDs...)
		}
	}
	return resp, toks
}

// Guided decoding survives a decode worker's death (issue 28 §3): the
// worker is killed mid-generation, inside the JSON; the request goes on
// on the other decode worker (KV re-sent by the prefill worker, or
// prefilled again in colocated mode), which rebuilds the grammar state
// from the tokens already generated instead of restarting it at its
// root. The output equals the engine's alone under the same grammar,
// token for token, greedy and sampled, and parses and validates against
// the schema.
func TestGuidedDecodingSurvivesFailover(t *testing.T) {
	ref := newReference(t)
	gbnf, err := grammar.FromSchema([]byte(guidedSchema))
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{coordinator.ModeDisaggregated, coordinator.ModeColocated} {
		for _, sampled := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/sampled=%v", mode, sampled), func(t *testing.T) {
				checkNoLeaks(t)
				cl := startCluster(t, clusterOpts{mode: mode, decode: 2, gated: true})
				guidedFailover(t, cl, ref, gbnf, sampled)
			})
		}
	}
}

// guidedFailover runs one structured-output completion on cl (two gated
// decode workers), kills the decode worker serving it after its first
// tokens, and checks the output across the failover against ref's
// under gbnf.
func guidedFailover(t *testing.T, cl *cluster, ref *reference, gbnf string, sampled bool) {
	t.Helper()
	seed := int64(11)
	for _, g := range cl.gates {
		g.allow(4)
	}
	tok := ref.eng.Tokenizer()
	prompt := tok.Encode("Answer in JSON: where, how many, and is it ok?")
	body := map[string]any{
		"prompt": prompt, "max_tokens": 400,
		"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "place", "strict": true, "schema": json.RawMessage(guidedSchema)}},
	}
	var s engine.Sampling
	if sampled {
		body["temperature"], body["seed"] = 0.9, seed
		s = engine.Sampling{Temperature: 0.9, Seed: uint64(seed)}
	} else {
		body["temperature"] = 0
	}
	want := ref.generateGuided(t, prompt, 400, s, gbnf)
	resp, toks := openGuided(context.Background(), t, cl.url, body, 3)
	defer resp.Body.Close()
	victim := pinActive(t, cl)
	if err := worker(cl, victim).Kill(); err != nil {
		t.Logf("kill %s: %v", victim, err)
	}
	rest, got := checkRest(t, resp, toks, want, "a failover")
	if len(toks) >= len(want)-1 {
		t.Errorf("the kill came after %d of %d tokens: not mid-generation", len(toks), len(want))
	}
	if rest.Budget["recoveries"] != 1.0 || rest.Budget["decode_worker"] == victim {
		t.Errorf("budget %v: want 1 recovery onto the other worker", rest.Budget)
	}
	text := tok.Decode(got)
	var v struct {
		City string
		N    *json.Number
		OK   *bool
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil || !slices.Contains([]string{"Zürich", "Lisbon", "Osaka"}, v.City) || v.N == nil || v.OK == nil || strings.ContainsAny(v.N.String(), ".eE") {
		t.Errorf("output %q does not validate against the schema: %+v, %v", text, v, err)
	}
	t.Logf("output across the failover (%d tokens before the kill): %s", len(toks), text)
	waitFor(t, 10*time.Second, func() error { return idleExcept(t, cl, victim) })
}

// grammarGatedLlama is a gated llama.cpp engine that keeps the engine's
// own grammar sampler (and metrics): the decode workers follow the
// grammar with llama.cpp's sampler, as they do ungated.
type grammarGatedLlama struct{ gatedLlama }

func (g grammarGatedLlama) NewGrammar(gbnf string) (engine.GrammarState, error) {
	return g.e.NewGrammar(gbnf)
}

var _ engine.GrammarSampler = grammarGatedLlama{}

// TestLlamacppGuidedDecodingSurvivesFailover is
// TestGuidedDecodingSurvivesFailover on llama.cpp (greedy,
// disaggregated): every worker follows the grammar with llama.cpp's
// grammar sampler, and the decode worker that takes the request over
// rebuilds that sampler's state by accepting the tokens generated before
// the kill.
func TestLlamacppGuidedDecodingSurvivesFailover(t *testing.T) {
	eo := llamaEngine(t)
	ref := newReferenceOf(t, eo)
	if _, ok := ref.eng.(engine.GrammarSampler); !ok {
		t.Fatalf("the llama.cpp engine %T has no grammar sampler of its own", ref.eng)
	}
	gbnf, err := grammar.FromSchema([]byte(guidedSchema))
	if err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t)
	var mu sync.Mutex
	gates := map[string]*gatedEngine{}
	cl := startCluster(t, clusterOpts{decode: 2, edit: func(o *coordinator.Options) { o.Engine = eo },
		worker: func(wo *workerrun.Options) {
			if wo.Role == control.RolePrefill {
				return
			}
			e, err := enginebuild.Build(eo)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { enginebuild.Close(e) })
			g := newGated(e)
			mu.Lock()
			gates[wo.ID] = g
			mu.Unlock()
			wo.EngineOverride = grammarGatedLlama{gatedLlama{g, e.(*llamacpp.Engine)}}
		}})
	mu.Lock()
	maps.Copy(cl.gates, gates)
	mu.Unlock()
	guidedFailover(t, cl, ref, gbnf, false)
}
