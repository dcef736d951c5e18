package main

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// checkServer answers like pdserve: /v1/models, /readyz and a completion,
// requiring key when it is not empty; reply is the completion's body.
func checkServer(t *testing.T, key, reply string) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			fmt.Fprint(w, "ok")
			return
		}
		if key != "" && r.Header.Get("Authorization") != "Bearer "+key {
			http.Error(w, `{"error":{"message":"no key"}}`, http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"tiny","object":"model"}]}`)
		case "/v1/completions":
			fmt.Fprint(w, reply)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func TestCheck(t *testing.T) {
	good := `{"object":"text_completion","choices":[{"index":0,"text":" world","finish_reason":"length"}]}`
	tests := []struct {
		name, key, reply string
		args             []string
		wantCode         int
		wantOut          string
	}{
		{name: "completion", reply: good, wantCode: exitOK, wantOut: "PASS"},
		{name: "with a key", key: "k1", reply: good, args: []string{"--api-key", "k1", "--auth"}, wantCode: exitOK, wantOut: "PASS"},
		{name: "auth on, no key: 401 checked", key: "k1", reply: good, args: []string{"--auth"}, wantCode: exitOK, wantOut: "PASS (API keys on"},
		{name: "auth off but the server wants a key", key: "k1", reply: good, wantCode: exitFail, wantOut: "answered 401"},
		{name: "open API with --auth", reply: good, args: []string{"--auth"}, wantCode: exitFail, wantOut: "want 401"},
		{name: "no finish reason", reply: `{"object":"text_completion","choices":[{"text":"x"}]}`, wantCode: exitFail, wantOut: "finish_reason"},
		{name: "not a completion", reply: `{"object":"chat.completion","choices":[]}`, wantCode: exitFail, wantOut: "want text_completion"},
		{name: "no text", reply: `{"object":"text_completion","choices":[{"finish_reason":"stop"}]}`, wantCode: exitFail, wantOut: "no text"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := checkServer(t, tt.key, tt.reply)
			var out, errOut bytes.Buffer
			t.Setenv("OPENAI_API_KEY", "")
			code := run(append([]string{"check", "--base-url", s.URL, "--wait", "0s"}, tt.args...), &out, &errOut)
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.wantCode, out.String(), errOut.String())
			}
			if got := out.String() + errOut.String(); !strings.Contains(got, tt.wantOut) {
				t.Errorf("output %q lacks %q", got, tt.wantOut)
			}
		})
	}
}

func TestCheckUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"check"}, &out, &errOut); code != exitUsage {
		t.Errorf("check without --base-url: exit %d, want %d (%s)", code, exitUsage, errOut.String())
	}
}
