package frontend

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdserve/pdserve/pkg/apikey"
)

const (
	keyTeamA = "sk-team-a-0123456789abcdef"
	keyTeamB = "sk-team-b-fedcba9876543210"
	keyWrong = "sk-wrong-00000000000000000"
	metricsT = "metrics-token-0123456789"
)

// fakeClock is a settable clock, safe for concurrent use.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// keyFile writes a key file of lines (each "KEY [name=…] [rpm=…]
// [tpm=…]", the key hashed) in a temporary directory and returns its
// path.
func keyFile(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys")
	rewriteKeys(t, path, lines...)
	return path
}

// rewriteKeys replaces the key file at path with lines (see keyFile).
func rewriteKeys(t *testing.T, path string, lines ...string) {
	t.Helper()
	var b strings.Builder
	for _, l := range lines {
		f := strings.Fields(l)
		name, rpm, tpm := "", 0, 0
		for _, kv := range f[1:] {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "name":
				name = v
			case "rpm":
				fmt.Sscan(v, &rpm)
			case "tpm":
				fmt.Sscan(v, &tpm)
			}
		}
		line, err := apikey.FormatLine(f[0], name, rpm, tpm)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(line + "\n")
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

func loadKeys(t *testing.T, path string) *apikey.Keys {
	t.Helper()
	k, err := apikey.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// noSecrets fails the test when a log entry holds one of secrets.
func noSecrets(t *testing.T, logs *observer.ObservedLogs, secrets ...string) {
	t.Helper()
	for _, e := range logs.All() {
		text := e.Message + " " + fmt.Sprint(e.ContextMap())
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("log line %q holds a secret: %s", e.Message, text)
			}
		}
	}
}

func (ts *testServer) get(t *testing.T, path string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, ts.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestAuthentication(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	path := keyFile(t, keyTeamA+" name=team-a", keyTeamB+" name=team-b")
	keys := loadKeys(t, path)
	ts := newTestServer(t, &fakeBackend{complete: echoText("ok")}, func(o *Options) {
		o.APIKeys = keys
		o.Logger = zap.New(core)
	})
	noKey := errorJSON{Message: msgNoKey, Type: "invalid_request_error", Code: ptr("invalid_api_key")}
	badKey := errorJSON{Message: msgBadKey, Type: "invalid_request_error", Code: ptr("invalid_api_key")}
	tests := []struct {
		name       string
		path       string
		auth       string // the Authorization header; "" for none
		wantStatus int
		wantErr    *errorJSON
		wantLog    map[string]any // fields of the refusal's log line
	}{
		{name: "no key", path: RouteCompletions, wantStatus: 401, wantErr: &noKey,
			wantLog: map[string]any{"api_key": "none", "reason": "missing_api_key"}},
		{name: "empty bearer", path: RouteChat, auth: "Bearer  ", wantStatus: 401, wantErr: &noKey,
			wantLog: map[string]any{"api_key": "none", "reason": "missing_api_key"}},
		{name: "basic auth", path: RouteCompletions, auth: "Basic " + keyTeamA, wantStatus: 401, wantErr: &noKey,
			wantLog: map[string]any{"api_key": "none", "reason": "missing_api_key"}},
		{name: "wrong key", path: RouteCompletions, auth: "Bearer " + keyWrong, wantStatus: 401, wantErr: &badKey,
			wantLog: map[string]any{"api_key": "unknown key", "reason": "invalid_api_key", "api_key_sha256": apikey.DigestPrefix(apikey.Hash(keyWrong))}},
		{name: "models without a key", path: RouteModels, wantStatus: 401, wantErr: &noKey,
			wantLog: map[string]any{"api_key": "none", "reason": "missing_api_key"}},
		{name: "unknown v1 path with a wrong key", path: "/v1/embeddings", auth: "Bearer " + keyWrong, wantStatus: 401, wantErr: &badKey,
			wantLog: map[string]any{"api_key": "unknown key", "reason": "invalid_api_key", "api_key_sha256": apikey.DigestPrefix(apikey.Hash(keyWrong))}},
		{name: "valid key", path: RouteCompletions, auth: "Bearer " + keyTeamA, wantStatus: 200},
		{name: "scheme in lower case", path: RouteCompletions, auth: "bearer " + keyTeamB, wantStatus: 200},
		{name: "models with a key", path: RouteModels, auth: "Bearer " + keyTeamB, wantStatus: 200},
		{name: "healthz open", path: "/healthz", wantStatus: 200},
		{name: "readyz open", path: "/readyz", wantStatus: 200},
		{name: "metrics open without a token", path: "/metrics", wantStatus: 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logs.TakeAll()
			var resp *http.Response
			switch tc.path {
			case RouteCompletions:
				resp = ts.post(t, tc.path, `{"prompt":"hi","max_tokens":2}`, "Authorization", tc.auth)
			case RouteChat:
				resp = ts.post(t, tc.path, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, "Authorization", tc.auth)
			default:
				var body string
				resp, body = ts.get(t, tc.path, "Authorization", tc.auth)
				resp.Body = io.NopCloser(strings.NewReader(body))
			}
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.wantStatus)
			}
			if tc.wantErr == nil {
				return
			}
			if diff := cmp.Diff(*tc.wantErr, errorBody(t, resp)); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			refused := logs.FilterMessage("request refused").All()
			if len(refused) != 1 {
				t.Fatalf("%d refusal log lines, want 1: %v", len(refused), logs.All())
			}
			got := refused[0].ContextMap()
			if refused[0].Level != zapcore.WarnLevel || got["http_status"] != int64(401) || got["path"] != tc.path {
				t.Errorf("refusal log %v %v", refused[0].Level, got)
			}
			for k, v := range tc.wantLog {
				if got[k] != v {
					t.Errorf("log field %s = %v, want %v", k, got[k], v)
				}
			}
			if _, ok := got["api_key_sha256"]; ok != (tc.wantLog["api_key_sha256"] != nil) {
				t.Errorf("log fields %v: api_key_sha256 present %v", got, ok)
			}
		})
	}
	// An accepted request's log line names its key.
	logs.TakeAll()
	ts.post(t, RouteCompletions, `{"prompt":"hi","max_tokens":2}`, "Authorization", "Bearer "+keyTeamA)
	if lines := logs.FilterMessage("request").FilterField(zap.String("api_key", "team-a")).Len(); lines != 1 {
		t.Errorf("%d request lines with api_key team-a, want 1: %v", lines, logs.All())
	}

	// A key revoked by a reload fails at once; the other still works.
	rewriteKeys(t, path, keyTeamB+" name=team-b")
	if _, err := keys.Reload(); err != nil {
		t.Fatal(err)
	}
	if resp := ts.post(t, RouteCompletions, `{"prompt":"hi","max_tokens":2}`, "Authorization", "Bearer "+keyTeamA); resp.StatusCode != 401 {
		t.Errorf("revoked key: status %d, want 401", resp.StatusCode)
	} else if diff := cmp.Diff(badKey, errorBody(t, resp)); diff != "" {
		t.Errorf("revoked key (-want +got):\n%s", diff)
	}
	if resp := ts.post(t, RouteCompletions, `{"prompt":"hi","max_tokens":2}`, "Authorization", "Bearer "+keyTeamB); resp.StatusCode != 200 {
		t.Errorf("kept key: status %d, want 200", resp.StatusCode)
	}
	noSecrets(t, logs, keyTeamA, keyTeamB, keyWrong)
}

// Budgets follow the authenticated key's name.
func TestAuthenticatedBudgets(t *testing.T) {
	keys := loadKeys(t, keyFile(t, keyTeamA+" name=small", keyTeamB+" name=other"))
	ts := newTestServer(t, &fakeBackend{complete: echoText("ok")}, func(o *Options) {
		o.APIKeys = keys
		o.Policy.Budgets.APIKeys = map[string]int{"small": 5}
	})
	resp := ts.post(t, RouteCompletions, `{"prompt":"abcdef","max_tokens":2}`, "Authorization", "Bearer "+keyTeamA)
	want := errorJSON{Message: "prompt has 6 tokens, over the budget of 5 tokens for api key small", Type: "invalid_request_error",
		Param: ptr("prompt"), Code: ptr("prompt_too_long")}
	if diff := cmp.Diff(want, errorBody(t, resp)); resp.StatusCode != 400 || diff != "" {
		t.Errorf("status %d (-want +got):\n%s", resp.StatusCode, diff)
	}
	if resp := ts.post(t, RouteCompletions, `{"prompt":"abcdef","max_tokens":2}`, "Authorization", "Bearer "+keyTeamB); resp.StatusCode != 200 {
		t.Errorf("other key: status %d, want 200 (the default budget)", resp.StatusCode)
	}
}

// rateHeaders returns the x-ratelimit-* headers of resp.
func rateHeaders(resp *http.Response) map[string]string {
	out := make(map[string]string)
	for k, v := range resp.Header {
		if strings.HasPrefix(strings.ToLower(k), "x-ratelimit-") {
			out[strings.ToLower(k)] = v[0]
		}
	}
	return out
}

func limits(reqLimit, reqLeft int, reqReset string, tokLimit, tokLeft int, tokReset string) map[string]string {
	m := map[string]string{}
	if reqLimit > 0 {
		m["x-ratelimit-limit-requests"] = fmt.Sprint(reqLimit)
		m["x-ratelimit-remaining-requests"] = fmt.Sprint(reqLeft)
		m["x-ratelimit-reset-requests"] = reqReset
	}
	if tokLimit > 0 {
		m["x-ratelimit-limit-tokens"] = fmt.Sprint(tokLimit)
		m["x-ratelimit-remaining-tokens"] = fmt.Sprint(tokLeft)
		m["x-ratelimit-reset-tokens"] = tokReset
	}
	return m
}

// Rate limits with a fake clock: headers on every response of a limited
// key, exact remaining and reset, 429 over a limit, the unused tokens
// given back at the end.
func TestRateLimits(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	keys := loadKeys(t, keyFile(t, keyTeamA+" name=team-a rpm=2 tpm=100", keyTeamB+" name=team-b tpm=50", keyWrong+" name=open"))
	ts := newTestServer(t, &fakeBackend{complete: echoText("xyz")}, func(o *Options) {
		o.APIKeys, o.Now, o.Logger = keys, clock.Now, zap.New(core)
		o.RetryAfter = 5 * time.Second
	})
	// Prompt "abcde": 5 tokens; max_tokens 10: 15 asked, 8 used (3 output).
	const body = `{"prompt":"abcde","max_tokens":10}`
	tooLarge := `{"prompt":"abcde","max_tokens":48,"n":2}` // 5 + 2 × 48 = 101 tokens
	rateLimit := func(typ, msg string) *errorJSON {
		return &errorJSON{Message: msg, Type: typ, Code: ptr("rate_limit_exceeded")}
	}
	steps := []struct {
		name        string
		advance     time.Duration
		key, body   string
		wantStatus  int
		wantHeaders map[string]string
		wantRetry   string
		wantErr     *errorJSON
	}{
		{name: "first", key: keyTeamA, body: body, wantStatus: 200,
			wantHeaders: limits(2, 1, "30s", 100, 85, "9s")},
		// The first gave 7 tokens back: 92 − 15. A stream gives its
		// unused tokens back before its end reaches the client.
		{name: "second, streamed", key: keyTeamA, body: `{"prompt":"abcde","max_tokens":10,"stream":true}`, wantStatus: 200,
			wantHeaders: limits(2, 0, "1m0s", 100, 77, "13.8s")},
		{name: "over the requests limit", key: keyTeamA, body: body, wantStatus: 429, wantRetry: "30",
			wantHeaders: limits(2, 0, "1m0s", 100, 84, "9.6s"),
			wantErr:     rateLimit("requests", "Rate limit reached for API key team-a on requests per min (RPM): Limit 2, Used 2, Requested 1. Please try again in 30s.")},
		// Over the whole limit: it never succeeds as it is, so no
		// Retry-After (SDKs would retry it forever), as OpenAI.
		{name: "half a minute later", advance: 30 * time.Second, key: keyTeamA, body: tooLarge, wantStatus: 429, wantRetry: "",
			wantHeaders: limits(2, 0, "1m0s", 100, 100, "0s"),
			wantErr:     rateLimit("tokens", "Request too large for API key team-a on tokens per min (TPM): Limit 100, Requested 101. The input or output tokens must be reduced in order to run successfully.")},
		{name: "tokens only", key: keyTeamB, body: `{"prompt":"abcde","max_tokens":40}`, wantStatus: 200,
			wantHeaders: limits(0, 0, "", 50, 5, "54s")},
		// 37 given back: 42, and 1.25 more in 1.5 s.
		{name: "over the tokens limit", advance: 1500 * time.Millisecond, key: keyTeamB, body: `{"prompt":"abcde","max_tokens":40}`, wantStatus: 429, wantRetry: "3",
			wantHeaders: limits(0, 0, "", 50, 43, "8.1s"),
			wantErr:     rateLimit("tokens", "Rate limit reached for API key team-b on tokens per min (TPM): Limit 50, Used 7, Requested 45. Please try again in 2.1s.")},
		{name: "no limits, no headers", key: keyWrong, body: body, wantStatus: 200, wantHeaders: map[string]string{}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			clock.Advance(s.advance)
			logs.TakeAll()
			resp := ts.post(t, RouteCompletions, s.body, "Authorization", "Bearer "+s.key)
			if resp.StatusCode != s.wantStatus {
				t.Fatalf("status %d, want %d", resp.StatusCode, s.wantStatus)
			}
			if diff := cmp.Diff(s.wantHeaders, rateHeaders(resp)); diff != "" {
				t.Errorf("headers (-want +got):\n%s", diff)
			}
			if got := resp.Header.Get("Retry-After"); got != s.wantRetry {
				t.Errorf("Retry-After %q, want %q", got, s.wantRetry)
			}
			if s.wantErr == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				return
			}
			if diff := cmp.Diff(*s.wantErr, errorBody(t, resp)); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			lines := logs.FilterMessage("request").FilterField(zap.Int("http_status", 429)).All()
			if len(lines) != 1 {
				t.Fatalf("%d 429 request lines, want 1: %v", len(lines), logs.All())
			}
			f := lines[0].ContextMap()
			if f["api_key"] == nil || f["api_key_sha256"] != apikey.DigestPrefix(apikey.Hash(s.key)) || f["status"] != "rejected" {
				t.Errorf("429 log fields %v", f)
			}
		})
	}
	noSecrets(t, logs, keyTeamA, keyTeamB, keyWrong)
}

func TestMetricsToken(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	path := filepath.Join(t.TempDir(), "metrics-token")
	if err := os.WriteFile(path, []byte(metricsT+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tok, err := apikey.LoadToken(path)
	if err != nil {
		t.Fatal(err)
	}
	ts := newTestServer(t, &fakeBackend{complete: echoText("ok")}, func(o *Options) {
		o.MetricsToken, o.Logger = tok, zap.New(core)
	})
	tests := []struct {
		name, auth string
		want       int
	}{
		{"no token", "", 401},
		{"wrong token", "Bearer " + keyWrong, 401},
		{"an API key is not the token", "Bearer " + keyTeamA, 401},
		{"token", "Bearer " + metricsT, 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := ts.get(t, "/metrics", "Authorization", tc.auth)
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.want, body)
			}
			if tc.want == 401 && resp.Header.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
			if tc.want == 200 && !strings.Contains(body, "pdserve_") {
				t.Errorf("metrics body lacks pdserve metrics:\n%s", body)
			}
		})
	}
	if n := logs.FilterMessage("metrics request refused").Len(); n != 3 {
		t.Errorf("%d metrics refusals logged, want 3", n)
	}
	// The API itself stays open without APIKeys.
	if resp := ts.post(t, RouteCompletions, `{"prompt":"hi","max_tokens":2}`); resp.StatusCode != 200 {
		t.Errorf("completion without keys configured: status %d", resp.StatusCode)
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if resp, _ := ts.get(t, p); resp.StatusCode != 200 {
			t.Errorf("%s: status %d", p, resp.StatusCode)
		}
	}
	noSecrets(t, logs, metricsT, keyWrong, keyTeamA)
}

func TestFormatReset(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{{0, "0s"}, {20 * time.Millisecond, "20ms"}, {1500 * time.Millisecond, "1.5s"}, {6 * time.Minute, "6m0s"}, {59999 * time.Millisecond, "59.999s"}} {
		if got := formatReset(tc.d); got != tc.want {
			t.Errorf("formatReset(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

// TestRetryOf: X-Stainless-Retry-Count as a whole number from 0 to 100;
// anything else (absent, negative, too large, not a number) is 0, a
// first try.
func TestRetryOf(t *testing.T) {
	for h, want := range map[string]int{"": 0, "0": 0, "2": 2, "100": 100, "101": 0, "-1": 0, "1.5": 0, "two": 0} {
		r := httptest.NewRequest(http.MethodPost, RouteCompletions, nil)
		if h != "" {
			r.Header.Set(HeaderRetryCount, h)
		}
		if got := retryOf(r); got != want {
			t.Errorf("%s: %q → %d, want %d", HeaderRetryCount, h, got, want)
		}
	}
}
