package coordinator_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// freePort returns a loopback port that was free a moment ago, from
// below Linux's ephemeral range (32768 and up by default): a port ":0"
// hands out may be taken again by any outgoing connection (the processes'
// own NATS and gRPC clients) before the process that is to listen on it
// starts, one below that range is not.
func freePort(t *testing.T) int {
	t.Helper()
	for range 100 {
		port := 20000 + mrand.IntN(12000)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			l.Close()
			return port
		}
	}
	t.Fatal("no free loopback port in 20000..31999")
	return 0
}

// syncBuffer is a bytes.Buffer safe for the process's output copier and
// the test reading it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a started binary.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error // Wait's result, once done is closed
}

func startProc(t *testing.T, ctx context.Context, bin, name string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.CommandContext(ctx, bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.WaitDelay = 5 * time.Second
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
	default:
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			t.Errorf("signal %s: %v", p.name, err)
		}
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			t.Errorf("%s did not exit 20 s after SIGTERM", p.name)
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	if p.err != nil {
		t.Errorf("%s exited with %v; output:\n%s", p.name, p.err, p.out.String())
	}
}

// The three binaries as separate processes serve the engine's outputs, in
// disaggregated mode and, through a second coordinator on the same NATS,
// in colocated mode.
func TestSeparateProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the coordinator and worker binaries as processes; skipped with -short")
	}
	bin := t.TempDir()
	repotest.Build(t, bin, "./cmd/coordinator", "./cmd/prefill-worker", "./cmd/decode-worker")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	natsPort, httpDis, httpCol := freePort(t), freePort(t), freePort(t)
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	common := []string{"--log-level", "warn", "--heartbeat-ttl", "2s"}
	// The embedded NATS server's users: the second coordinator's, one the
	// prefill and decode workers of a role share, one bound to the
	// colocated worker's id. Each client reads its password from a file.
	login, authFile := natsLogins(t, []natsLogin{
		{user: "coordinator", role: "coordinator"}, {user: "prefill", role: "prefill"},
		{user: "decode", role: "decode"}, {user: "colocated-p", role: "colocated", id: "colocated-p"},
	})
	var procs []*proc
	defer func() {
		// Workers first, then the colocated coordinator, then the one
		// hosting NATS.
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].stop(t)
		}
	}()
	worker := []string{"--nats-url", natsURL, "--grpc-addr", "127.0.0.1:0", "--metrics-addr", "", "--heartbeat-interval", "50ms",
		"--log-level", "warn", "--chunk-tokens", "16", "--nats-reconnect-wait", "100ms"}
	// The prefill worker starts before the NATS server is up: it waits,
	// then joins.
	early := startProc(t, ctx, filepath.Join(bin, "prefill-worker"), "prefill-worker", append(append(worker, login["prefill"]...), "--id", "prefill-p", "--max-batch-tokens", "64")...)
	dis := startProc(t, ctx, filepath.Join(bin, "coordinator"), "coordinator (disaggregated)", append([]string{
		"--http-addr", "127.0.0.1:" + strconv.Itoa(httpDis), "--nats-listen", "127.0.0.1:" + strconv.Itoa(natsPort), "--nats-auth-file", authFile}, common...)...)
	procs = append(procs, dis)
	waitHTTP(t, dis, httpDis, "/healthz")
	procs = append(procs, startProc(t, ctx, filepath.Join(bin, "coordinator"), "coordinator (colocated)", append(append([]string{
		"--http-addr", "127.0.0.1:" + strconv.Itoa(httpCol), "--nats-url", natsURL, "--mode", "colocated"}, login["coordinator"]...), common...)...))
	procs = append(procs, early,
		startProc(t, ctx, filepath.Join(bin, "decode-worker"), "decode-worker", append(append(worker, login["decode"]...), "--id", "decode-p", "--kv-blocks", "512")...),
		startProc(t, ctx, filepath.Join(bin, "decode-worker"), "colocated-worker", append(append(worker, login["colocated-p"]...), "--id", "colocated-p", "--role", "colocated", "--kv-blocks", "512")...),
	)
	waitHTTP(t, procs[0], httpDis, "/readyz")
	waitHTTP(t, procs[1], httpCol, "/readyz")

	ref := newReference(t)
	for _, mode := range []struct {
		name string
		port int
	}{{"disaggregated", httpDis}, {"colocated", httpCol}} {
		for _, p := range prompts[:3] {
			for _, stream := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/stream=%v", mode.name, p.name, stream), func(t *testing.T) {
					want := ref.generate(t, promptIDs(p.prompt), 16, engine.Sampling{}, true)
					got := complete(ctx, t, fmt.Sprintf("http://127.0.0.1:%d", mode.port),
						request{Prompt: p.prompt, MaxTokens: 16, IgnoreEOS: true, Stream: stream})
					if diff := cmp.Diff(want, got.Tokens); diff != "" {
						t.Errorf("tokens (-engine alone +served):\n%s", diff)
					}
					if wantText := clientText(t, tokenizer.Bytes{}, want); got.Text != wantText {
						t.Errorf("text %q, want %q", got.Text, wantText)
					}
					if got.Budget["mode"] != mode.name {
						t.Errorf("served in mode %v, want %s", got.Budget["mode"], mode.name)
					}
				})
			}
		}
	}
}

// natsLogin is one user of the embedded NATS server's users file.
type natsLogin struct{ user, role, id string }

// natsLogins writes a users file with a random password per user, and a
// password file per user; it returns the users file and, by user, the
// flags that log in as that user.
func natsLogins(t *testing.T, users []natsLogin) (map[string][]string, string) {
	t.Helper()
	dir := t.TempDir()
	flags := map[string][]string{}
	var file bytes.Buffer
	file.WriteString("users:\n")
	for _, u := range users {
		pw := strconv.FormatUint(mrand.Uint64(), 36) + strconv.FormatUint(mrand.Uint64(), 36)
		fmt.Fprintf(&file, "  - {user: %s, password: %s, role: %s, id: %q}\n", u.user, pw, u.role, u.id)
		pwFile := filepath.Join(dir, u.user+".password")
		if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		flags[u.user] = []string{"--nats-user", u.user, "--nats-password-file", pwFile}
	}
	path := filepath.Join(dir, "nats-users.yaml")
	if err := os.WriteFile(path, file.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return flags, path
}

// waitHTTP polls path on port until it answers 200, failing early when the
// process exits.
func waitHTTP(t *testing.T, p *proc, port int, path string) {
	t.Helper()
	url := fmt.Sprintf("http://127.0.0.1:%d%s", port, path)
	waitFor(t, 30*time.Second, func() error {
		select {
		case <-p.done:
			t.Fatalf("%s exited (%v) before %s answered; output:\n%s", p.name, p.err, path, p.out.String())
		default:
		}
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %d", url, resp.StatusCode)
		}
		return nil
	})
}
