package frontend

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/grammar"
)

// A grammar's cost counts against the key's tokens a minute, n times
// (grammar.CostTokens per choice), and is not given back at the end: a
// request that fits the key's limit without its schema is refused with
// it, and a second request sees the first one's grammar spent.
func TestGrammarCharged(t *testing.T) {
	vals := make([]string, 200)
	for i := range vals {
		vals[i] = fmt.Sprintf("%q", fmt.Sprint(strings.Repeat("v", 40), i))
	}
	schema := `{"type":"array","items":{"enum":[` + strings.Join(vals, ",") + `]}}`
	gbnf, err := grammar.FromSchema([]byte(schema))
	if err != nil {
		t.Fatal(err)
	}
	cost := grammar.CostTokens(gbnf)
	if cost < 20 {
		t.Fatalf("the schema's grammar costs %d tokens a choice; the test wants more", cost)
	}
	plain := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":10,"n":2}`
	guided := strings.TrimSuffix(plain, "}") + `,"response_format":{"type":"json_schema","json_schema":{"name":"s","strict":true,"schema":` + schema + `}}}`

	type usage struct{ prompt, completion int }
	post := func(ts *testServer, body string) (status, remaining int, u usage) {
		resp := ts.post(t, RouteChat, body, "Authorization", "Bearer "+keyTeamA)
		defer resp.Body.Close()
		remaining, _ = strconv.Atoi(resp.Header.Get("x-ratelimit-remaining-tokens"))
		if resp.StatusCode == 200 {
			var raw struct {
				Usage struct {
					PromptTokens     int `json:"prompt_tokens"`
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
				t.Fatal(err)
			}
			u = usage{raw.Usage.PromptTokens, raw.Usage.CompletionTokens}
		}
		return resp.StatusCode, remaining, u
	}
	server := func(tpm int) *testServer {
		clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
		keys := loadKeys(t, keyFile(t, fmt.Sprintf("%s name=team-a tpm=%d", keyTeamA, tpm)))
		return newTestServer(t, &fakeBackend{complete: echoText(`["`)}, func(o *Options) { o.APIKeys, o.Now = keys, clock.Now })
	}

	// What the plain request asks, read from a roomy key.
	const roomy = 100_000
	st, rem, u := post(server(roomy), plain)
	if st != 200 {
		t.Fatalf("plain: status %d", st)
	}
	asked := roomy - rem
	if want := u.prompt + 2*10; asked != want {
		t.Fatalf("plain asked %d tokens, want %d", asked, want)
	}

	// A key with room for the plain request and part of the grammar.
	tight := server(asked + 2*cost - 1)
	if st, _, _ := post(tight, guided); st != 429 {
		t.Errorf("guided on a key of %d tokens a minute: status %d, want 429 (it asks %d)", asked+2*cost-1, st, asked+2*cost)
	}
	if st, _, _ := post(tight, plain); st != 200 {
		t.Errorf("plain on the same key: status %d, want 200", st)
	}

	// Charged at admission and not given back.
	ts := server(roomy)
	st, rem1, u1 := post(ts, guided)
	if st != 200 {
		t.Fatalf("guided: status %d", st)
	}
	if want := roomy - (asked + 2*cost); rem1 != want {
		t.Errorf("remaining after admitting the guided request %d, want %d", rem1, want)
	}
	_, rem2, _ := post(ts, plain)
	used1 := u1.prompt + u1.completion + 2*cost
	if want := roomy - used1 - asked; rem2 != want {
		t.Errorf("remaining after the guided request ended and the plain one was admitted: %d, want %d (the grammar's %d kept)", rem2, want, 2*cost)
	}
}
