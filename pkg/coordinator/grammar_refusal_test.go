package coordinator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/grammar"
)

// overflowSchema is a schema within pkg/grammar's limits whose grammar
// allows no token once an object of it opens: an anyOf of three objects
// of 1,500 optional properties each holds 4,500 parse stacks after "{",
// over the matcher's bound.
func overflowSchema() string {
	var b strings.Builder
	b.WriteString(`{"anyOf":[`)
	for o := range 3 {
		if o > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"type":"object","properties":{`)
		for i := range 1500 {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"o%dp%d":{"type":"null"}`, o, i)
		}
		b.WriteString(`}}`)
	}
	b.WriteString(`]}`)
	return b.String()
}

// A grammar that allows no token ends the request with an error, through
// the coordinator's HTTP (issue 39 §1): a 500 without a stream, an error
// event on one, and never a token the grammar refused (on the old code:
// 200 with "{{{{…" or NUL bytes, the grammar's refusals only logged).
// Disaggregated (the prefill worker's first token) and colocated.
func TestGrammarAllowingNoTokenIsAnError(t *testing.T) {
	later := `{"type":"object","properties":{"a":` + overflowSchema() + `},"required":["a"]}`
	gbnf, err := grammar.FromSchema([]byte(later))
	if err != nil {
		t.Fatal(err)
	}
	g, err := grammar.Parse(gbnf, "root")
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{coordinator.ModeDisaggregated, coordinator.ModeColocated} {
		t.Run(mode, func(t *testing.T) {
			checkNoLeaks(t)
			cl := startCluster(t, clusterOpts{mode: mode})
			ctx := context.Background()
			body := func(schema string, stream bool) map[string]any {
				return map[string]any{
					"prompt": "Answer in JSON.", "max_tokens": 64, "temperature": 1, "seed": 5, "stream": stream,
					"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "s", "schema": json.RawMessage(schema)}},
				}
			}
			resp := post(ctx, t, cl.url+"/v1/completions", body(overflowSchema(), false))
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusInternalServerError || resp.Header.Get("Retry-After") != "" || !strings.Contains(string(b), `"error"`) {
				t.Errorf("no first token: status %d, Retry-After %q: %s; want 500 with an error and no Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), b)
			}
			resp = post(ctx, t, cl.url+"/v1/completions", body(later, true))
			r, err := readStream(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if r.Err == "" || r.Finish != "" {
				t.Errorf("mid-stream: finish %q, error %q after %q; want an error event", r.Finish, r.Err, r.Text)
			}
			m, err := g.Matcher()
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(r.Text, "{") || m.Accept([]byte(r.Text)) != nil {
				t.Errorf("mid-stream: text %q sent, want a prefix the grammar allows", r.Text)
			}
			waitFor(t, 10*time.Second, func() error { return idleExcept(t, cl, "") })
		})
	}
}
