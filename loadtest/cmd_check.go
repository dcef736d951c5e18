package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// errCheck is a failed check of `loadtest check`.
var errCheck = errors.New("check failed")

// checkOptions are the flags of `loadtest check`.
type checkOptions struct {
	BaseURL   string
	APIKey    string
	Model     string
	Prompt    string
	MaxTokens int
	// AuthOn: the server requires API keys. Without APIKey the check is
	// then that a request without a key gets 401.
	AuthOn  bool
	Wait    time.Duration // how long the server may take to answer at all
	Timeout time.Duration // per request
}

// cmdCheck is `loadtest check`: one completion against a server, its
// reply checked (the chart's `helm test`).
func cmdCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := checkOptions{APIKey: os.Getenv("OPENAI_API_KEY"), Prompt: "Hello", MaxTokens: 4, Wait: 30 * time.Second, Timeout: 2 * time.Minute}
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	setUsage(fs, stderr, "check --base-url URL [flags]",
		"Send one completion to an OpenAI-compatible server and check the reply: a text_completion\n"+
			"with a choice holding text and a finish reason (stop or length). With --auth and no key,\n"+
			"check instead that /v1/models refuses a request without a key (401) and /readyz answers.\n"+
			"Exits 0 and prints PASS, or exits 1 naming what failed. The chart's `helm test` runs it.",
		"  go run ./loadtest check --base-url http://127.0.0.1:8080\n"+
			"  OPENAI_API_KEY=$KEY go run ./loadtest check --base-url http://pd-pdserve-coordinator:80 --auth\n")
	fs.StringVar(&o.BaseURL, "base-url", o.BaseURL, "server root URL, e.g. http://127.0.0.1:8080")
	fs.StringVar(&o.APIKey, "api-key", o.APIKey, "bearer token (default: $OPENAI_API_KEY)")
	fs.StringVar(&o.Model, "model", o.Model, "model name to send (empty: the first of GET /v1/models)")
	fs.StringVar(&o.Prompt, "prompt", o.Prompt, "prompt of the completion")
	fs.IntVar(&o.MaxTokens, "max-tokens", o.MaxTokens, "max_tokens of the completion (> 0)")
	fs.BoolVar(&o.AuthOn, "auth", o.AuthOn, "the server requires API keys (without a key: check that it refuses)")
	fs.DurationVar(&o.Wait, "wait", o.Wait, "how long to retry while the server refuses connections or is not ready")
	fs.DurationVar(&o.Timeout, "request-timeout", o.Timeout, "per-request time limit")
	if err := parseFlags(fs, args, nil); err != nil {
		return err
	}
	if o.BaseURL == "" {
		return fmt.Errorf("%w: --base-url is required", errUsage)
	}
	if o.MaxTokens <= 0 {
		return fmt.Errorf("%w: --max-tokens %d: must be > 0", errUsage, o.MaxTokens)
	}
	return check(ctx, o, stdout)
}

// check runs the checks of o, printing what it does on w.
func check(ctx context.Context, o checkOptions, w io.Writer) error {
	base := strings.TrimRight(o.BaseURL, "/")
	cl := &http.Client{Timeout: o.Timeout}
	do := func(method, path string, body []byte, key bool) (int, []byte, error) {
		deadline := time.Now().Add(o.Wait)
		for {
			var rd io.Reader
			if body != nil {
				rd = bytes.NewReader(body)
			}
			req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
			if err != nil {
				return 0, nil, err
			}
			if body != nil {
				req.Header.Set("Content-Type", "application/json")
			}
			if key && o.APIKey != "" {
				req.Header.Set("Authorization", "Bearer "+o.APIKey)
			}
			resp, err := cl.Do(req)
			if err == nil {
				b, rerr := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
				resp.Body.Close()
				// 503: not ready yet (no workers joined); retry like a refused connection.
				if resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
					return resp.StatusCode, b, rerr
				}
			} else if time.Now().After(deadline) || ctx.Err() != nil {
				return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
			}
			select {
			case <-ctx.Done():
				return 0, nil, ctx.Err()
			case <-time.After(time.Second):
			}
		}
	}
	if o.AuthOn && o.APIKey == "" {
		code, _, err := do(http.MethodGet, "/v1/models", nil, false)
		if err != nil {
			return fmt.Errorf("%w: %v", errCheck, err)
		}
		if code != http.StatusUnauthorized {
			return fmt.Errorf("%w: /v1/models without a key answered %d, want 401", errCheck, code)
		}
		if code, b, err := do(http.MethodGet, "/readyz", nil, false); err != nil || code != http.StatusOK {
			return fmt.Errorf("%w: /readyz answered %d %s (%v)", errCheck, code, truncText(b), err)
		}
		fmt.Fprintln(w, "PASS (API keys on: a request without a key gets 401)")
		return nil
	}
	model := o.Model
	if model == "" {
		code, b, err := do(http.MethodGet, "/v1/models", nil, true)
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("%w: GET /v1/models answered %d %s (%v)", errCheck, code, truncText(b), err)
		}
		var list struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if err := json.Unmarshal(b, &list); err != nil || len(list.Data) == 0 || list.Data[0].ID == "" {
			return fmt.Errorf("%w: no model listed on /v1/models: %s", errCheck, truncText(b))
		}
		model = list.Data[0].ID
	}
	body, err := json.Marshal(map[string]any{"model": model, "prompt": o.Prompt, "max_tokens": o.MaxTokens})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "POST %s/v1/completions %s\n", base, body)
	code, b, err := do(http.MethodPost, "/v1/completions", body, true)
	if err != nil {
		return fmt.Errorf("%w: %v", errCheck, err)
	}
	fmt.Fprintf(w, "%d %s\n", code, truncText(b))
	if code != http.StatusOK {
		return fmt.Errorf("%w: POST /v1/completions answered %d", errCheck, code)
	}
	var reply struct {
		Object  string `json:"object"`
		Choices []struct {
			Text         *string `json:"text"`
			FinishReason string  `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &reply); err != nil {
		return fmt.Errorf("%w: reply is not JSON: %v", errCheck, err)
	}
	switch {
	case reply.Object != "text_completion":
		return fmt.Errorf("%w: object %q, want text_completion", errCheck, reply.Object)
	case len(reply.Choices) == 0 || reply.Choices[0].Text == nil:
		return fmt.Errorf("%w: no text in the reply", errCheck)
	case reply.Choices[0].FinishReason != "stop" && reply.Choices[0].FinishReason != "length":
		return fmt.Errorf("%w: finish_reason %q, want stop or length", errCheck, reply.Choices[0].FinishReason)
	}
	fmt.Fprintln(w, "PASS")
	return nil
}

// truncText is b as text, cut to 2000 bytes.
func truncText(b []byte) string {
	if len(b) > 2000 {
		return string(b[:2000]) + "…"
	}
	return string(b)
}
