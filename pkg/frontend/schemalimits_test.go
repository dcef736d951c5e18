package frontend

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// schemaProps is an object schema of n optional properties.
func schemaProps(n int) string {
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"p%d":{"type":"integer"}`, i)
	}
	b.WriteString(`}}`)
	return b.String()
}

// schemaAnyOf is an anyOf of n alternatives alt(i).
func schemaAnyOf(n int, alt func(int) string) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = alt(i)
	}
	return `{"anyOf":[` + strings.Join(parts, ",") + `]}`
}

// A schema over one of pkg/grammar's limits is a 400 naming the limit,
// with no Retry-After (issue 38 §5: a permanent refusal is never 429 or
// 503); the issues' large schemas within the limits reach the backend
// with their grammar. On the old code 2,048 properties were refused as
// "must be a JSON Schema object", 1,367 distinct alternatives and a
// 300,000-byte const were sent on (the grammar then failed in the
// workers), and a grammar over 1 MiB got 429 or 503 with Retry-After.
func TestSchemaLimits(t *testing.T) {
	var mu sync.Mutex
	var grammars []string
	ts := newTestServer(t, &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		mu.Lock()
		grammars = append(grammars, req.Sampling.Grammar)
		mu.Unlock()
		return echoText("{}")(ctx, req, emit)
	}}, func(o *Options) { o.MaxBodyBytes = 4 << 20 })
	format := func(schema string) string {
		return `{"prompt":"a","max_tokens":2,"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":` + schema + `}}}`
	}
	tool := func(schema string) string {
		return `{"messages":[{"role":"user","content":"a"}],"max_tokens":2,"tools":[{"type":"function","function":{"name":"f","parameters":` + schema + `}}],"tool_choice":"required"}`
	}
	distinct := func(i int) string { return fmt.Sprintf(`{"const":"v%d"}`, i) }
	for _, tc := range []struct {
		name, path, body string
		limit, param     string // "": 200
	}{
		{"1,100 optional properties", RouteCompletions, format(schemaProps(1100)), "", ""},
		{"2,048 optional properties", RouteCompletions, format(schemaProps(2048)), "", ""},
		{"1,367 identical alternatives", RouteCompletions, format(schemaAnyOf(1367, func(int) string { return `{"type":"string"}` })), "", ""},
		{"1,367 distinct alternatives", RouteCompletions, format(schemaAnyOf(1367, distinct)), "1024 alternatives", "response_format.json_schema.schema"},
		{"3,000 properties", RouteCompletions, format(schemaProps(3000)), "2048 properties", "response_format.json_schema.schema"},
		{"a long const", RouteCompletions, format(`{"const":"` + strings.Repeat("x", 200_000) + `"}`), "120000 literal bytes", "response_format.json_schema.schema"},
		{"a large schema", RouteCompletions, format(`{"description":"` + strings.Repeat("d", 300_000) + `"}`), "262144 schema bytes", "response_format.json_schema.schema"},
		{"deep nesting", RouteCompletions, format(strings.Repeat(`{"type":"array","items":`, 40) + `{}` + strings.Repeat(`}`, 40)), "32 depth", "response_format.json_schema.schema"},
		{"tool parameters", RouteChat, tool(schemaAnyOf(1367, distinct)), "1024 alternatives", "tools"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := ts.post(t, tc.path, tc.body)
			if tc.limit == "" {
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d: %+v", resp.StatusCode, errorBody(t, resp))
				}
				return
			}
			if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Retry-After") != "" {
				t.Fatalf("status %d Retry-After %q, want 400 without it", resp.StatusCode, resp.Header.Get("Retry-After"))
			}
			e := errorBody(t, resp)
			if deref(e.Code) != "schema_too_large" || deref(e.Param) != tc.param || !strings.Contains(e.Message, "over the limit of "+tc.limit) {
				t.Errorf("error %q (code %q, param %q), want schema_too_large on %s naming %q", e.Message, deref(e.Code), deref(e.Param), tc.param, tc.limit)
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	if len(grammars) != 3 {
		t.Fatalf("the backend got %d requests, want the 3 within the limits", len(grammars))
	}
	for i, g := range grammars {
		if g == "" || len(g) > 1<<20 {
			t.Errorf("request %d: grammar of %d bytes", i, len(g))
		}
	}
}
