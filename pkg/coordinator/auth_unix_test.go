//go:build unix

package coordinator_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/coordinatorrun"
)

// SIGHUP reloads the key file of a running coordinator: a revoked key
// fails at once. The file watch is off, so only the signal can reload.
func TestAuthSIGHUPReload(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "api-keys")
	writeAuthFile(t, keys, hashKey(t, authKeyA, "--name", "team-a")+hashKey(t, authKeyB, "--name", "team-b"))
	port := freePort(t)
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out bytes.Buffer
	code := make(chan int, 1)
	go func() {
		code <- coordinatorrun.Main(ctx, []string{"--standalone", "--http-addr", fmt.Sprintf("127.0.0.1:%d", port),
			"--nats-listen", "127.0.0.1:-1", "--log-level", "error", "--heartbeat-ttl", "2s",
			"--api-keys", keys, "--auth-reload-interval", "0"}, &out, &out)
	}()
	waitFor(t, 20*time.Second, func() error {
		select {
		case c := <-code:
			t.Fatalf("Main returned %d before serving: %s", c, out.String())
		default:
		}
		resp, err := http.Get(url + "/readyz") // open without a key
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	})
	if c, _ := httpGet(t, url+"/v1/models", authKeyA); c != 200 {
		t.Fatalf("key A before the reload: %d", c)
	}
	completion := func(key string) int {
		req, err := http.NewRequest(http.MethodPost, url+"/v1/completions", bytes.NewReader([]byte(`{"prompt":"hello","max_tokens":2}`)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := completion(authKeyA); c != 200 {
		t.Errorf("completion with key A: %d, want 200", c)
	}

	writeAuthFile(t, keys, hashKey(t, authKeyB, "--name", "team-b"))
	if c, _ := httpGet(t, url+"/v1/models", authKeyA); c != 200 {
		t.Fatalf("key A reloaded without the signal (watch off): %d", c)
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() error {
		if c, _ := httpGet(t, url+"/v1/models", authKeyA); c != 401 {
			return fmt.Errorf("key A after SIGHUP: %d, want 401", c)
		}
		return nil
	})
	if c := completion(authKeyA); c != 401 {
		t.Errorf("completion with the revoked key: %d, want 401", c)
	}
	if c := completion(authKeyB); c != 200 {
		t.Errorf("completion with key B: %d, want 200", c)
	}
	cancel()
	select {
	case c := <-code:
		if c != 0 {
			t.Errorf("exit code %d after cancel: %s", c, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Main did not return 30 s after cancel")
	}
}
