package coordinator_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/coordinatorrun"
)

const (
	authKeyA     = "sk-coordinator-test-key-a-0123456789"
	authKeyB     = "sk-coordinator-test-key-b-9876543210"
	authMetricsT = "metrics-token-for-the-coordinator"
)

// hashKey runs the hash-key subcommand on key with args and returns its
// line, failing the test unless it succeeds.
func hashKey(t *testing.T, key string, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := coordinatorrun.HashKey(args, strings.NewReader(key+"\n"), &out, &errOut); code != 0 {
		t.Fatalf("hash-key exit %d: %s", code, errOut.String())
	}
	return out.String()
}

func writeAuthFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// httpGet sends a GET with an optional bearer token and returns the
// status and body.
func httpGet(t *testing.T, url, bearer string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A bad key or token file stops the coordinator at start with exit 2 and
// an error naming the line, never the key.
func TestAuthStartErrors(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	writeAuthFile(t, plain, "# team a\n"+strings.TrimSpace(hashKey(t, authKeyA, "--name", "a"))+"\n"+authKeyB+" name=b\n")
	good := filepath.Join(dir, "good")
	writeAuthFile(t, good, hashKey(t, authKeyA, "--name", "team-a"))
	short := filepath.Join(dir, "short-token")
	writeAuthFile(t, short, "tiny\n")
	budgets := filepath.Join(dir, "policy.yaml")
	writeAuthFile(t, budgets, "prompt_budgets: {api_keys: {team-b: 10, "+authKeyB+": 5}}\nauth: {api_keys_file: good}\n")
	same := filepath.Join(dir, "same.yaml")
	writeAuthFile(t, same, "auth: {api_keys_file: good, metrics_token_file: good}\n")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"plaintext key", []string{"--api-keys", plain}, plain + ": line 3: not a sha256:<64 hex digits> key hash"},
		{"missing key file", []string{"--api-keys", filepath.Join(dir, "none")}, "no such file"},
		{"short metrics token", []string{"--metrics-token-file", short}, "fewer than 16"},
		{"budget of no key", []string{"--policy", budgets}, `prompt_budgets.api_keys entry "…3210" is not the name of a key`},
		{"one file for both", []string{"--policy", same}, "are the same file"},
		{"negative reload interval", []string{"--auth-reload-interval", "-1s"}, "auth-reload-interval"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			code := coordinatorrun.Main(context.Background(), append(tc.args, "--http-addr", "127.0.0.1:0"), &out, &out)
			if code != 2 || !strings.Contains(out.String(), tc.want) {
				t.Errorf("exit %d, output %q; want exit 2 with %q", code, out.String(), tc.want)
			}
			for _, secret := range []string{authKeyA, authKeyB, "tiny"} {
				if strings.Contains(out.String(), secret) {
					t.Errorf("output holds the secret %q: %s", secret, out.String())
				}
			}
		})
	}
}

// startAuthed starts a coordinator without workers with o's auth settings
// edited by edit, logging into an observer, and returns its URL and logs.
func startAuthed(t *testing.T, edit func(*coordinator.Options)) (string, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	o := coordinator.DefaultOptions()
	o.HTTPAddr, o.NATSListen, o.ModelName = "127.0.0.1:0", "127.0.0.1:-1", "m"
	edit(&o)
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	c, err := coordinator.Start(context.Background(), o, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return "http://" + c.HTTPAddr(), logs
}

// noSecretLogged fails the test when a log entry holds one of secrets.
func noSecretLogged(t *testing.T, logs *observer.ObservedLogs, secrets ...string) {
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

// Keys from hash-key authenticate; the watch reloads the key file without
// a restart: a revoked key fails at once, a file that fails to parse
// keeps the old keys; every refusal is logged without a secret.
func TestAuthWatchReload(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "api-keys")
	writeAuthFile(t, keys, hashKey(t, authKeyA, "--name", "team-a")+hashKey(t, authKeyB, "--name", "team-b", "--rpm", "100"))
	token := filepath.Join(dir, "metrics-token")
	writeAuthFile(t, token, authMetricsT+"\n")
	url, logs := startAuthed(t, func(o *coordinator.Options) {
		o.Auth.APIKeysFile, o.Auth.MetricsTokenFile = keys, token
		o.Auth.ReloadInterval = 5 * time.Millisecond
	})

	checks := []struct {
		path, bearer string
		want         int
	}{
		{"/v1/models", "", 401},
		{"/v1/models", "sk-not-a-key-0000000000000", 401},
		{"/v1/models", authKeyA, 200},
		{"/v1/models", authKeyB, 200},
		{"/healthz", "", 200},
		{"/readyz", "", 503}, // no workers, but not 401
		{"/metrics", "", 401},
		{"/metrics", authKeyA, 401},
		{"/metrics", authMetricsT, 200},
	}
	for _, c := range checks {
		if code, body := httpGet(t, url+c.path, c.bearer); code != c.want {
			t.Errorf("GET %s (bearer %v): %d, want %d: %s", c.path, c.bearer != "", code, c.want, body)
		}
	}
	resp := post(context.Background(), t, url+"/v1/completions", request{Prompt: "hi", MaxTokens: 2})
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("completion without a key: %d, want 401", resp.StatusCode)
	}

	// Revoke A.
	writeAuthFile(t, keys, hashKey(t, authKeyB, "--name", "team-b", "--rpm", "100"))
	waitFor(t, 10*time.Second, func() error {
		if code, _ := httpGet(t, url+"/v1/models", authKeyA); code != 401 {
			return fmt.Errorf("revoked key: %d, want 401", code)
		}
		return nil
	})
	if code, _ := httpGet(t, url+"/v1/models", authKeyB); code != 200 {
		t.Errorf("kept key after the reload: %d, want 200", code)
	}
	// The reload logs after it replaced the keys (apikey.Watch): a
	// request can see the new keys first.
	waitFor(t, 10*time.Second, func() error {
		if logs.FilterMessage("reloaded").FilterField(zap.String("trigger", "change")).Len() < 1 {
			return fmt.Errorf("no reload logged")
		}
		return nil
	})

	// A plaintext key: the reload fails, is logged once, B stays.
	writeAuthFile(t, keys, hashKey(t, authKeyB, "--name", "team-b", "--rpm", "100")+authKeyA+" name=team-a\n")
	waitFor(t, 10*time.Second, func() error {
		if logs.FilterMessageSnippet("reload failed").Len() == 0 {
			return fmt.Errorf("no failed reload logged")
		}
		return nil
	})
	if code, _ := httpGet(t, url+"/v1/models", authKeyB); code != 200 {
		t.Errorf("key after a failed reload: %d, want 200", code)
	}
	if code, _ := httpGet(t, url+"/v1/models", authKeyA); code != 401 {
		t.Errorf("plaintext key of a failed reload: %d, want 401", code)
	}

	refused := logs.FilterMessage("request refused").All()
	if len(refused) < 4 {
		t.Errorf("%d refusals logged, want at least 4", len(refused))
	}
	for _, e := range refused {
		if f := e.ContextMap(); f["api_key"] != "none" && f["api_key"] != "unknown key" {
			t.Errorf("refusal names key %v", f["api_key"])
		}
	}
	if logs.FilterMessage("metrics request refused").Len() != 2 {
		t.Errorf("metrics refusals not logged: %v", logs.FilterMessage("metrics request refused").All())
	}
	if logs.FilterMessageSnippet("the API is open").Len() != 0 {
		t.Error("warned that the API is open although keys are configured")
	}
	noSecretLogged(t, logs, authKeyA, authKeyB, authMetricsT, "sk-not-a-key")
}

// Without keys the API is open, as before, and the start warns so.
func TestAuthOpenWarns(t *testing.T) {
	url, logs := startAuthed(t, func(*coordinator.Options) {})
	if code, _ := httpGet(t, url+"/v1/models", ""); code != 200 {
		t.Errorf("/v1/models without keys configured: %d, want 200", code)
	}
	if code, _ := httpGet(t, url+"/metrics", ""); code != 200 {
		t.Errorf("/metrics without a token configured: %d, want 200", code)
	}
	if w := logs.FilterMessageSnippet("the API is open").FilterLevelExact(zapcore.WarnLevel).Len(); w != 1 {
		t.Errorf("%d warnings that the API is open, want 1", w)
	}
}
