package workerrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/control"
)

// readyz returns the worker's /readyz status code and body.
func readyz(t *testing.T, w *Worker) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + w.MetricsAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// passwordFile writes u's password to a file and returns options that log
// in as u through it, retrying every few milliseconds.
func passwordFile(t *testing.T, u control.NATSUser) control.ConnOptions {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nats-password")
	if err := os.WriteFile(path, []byte(u.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return control.ConnOptions{User: u.User, PasswordFile: path, ReconnectWait: 10 * time.Millisecond}
}

// A worker started before its NATS server is up waits, not ready, and
// joins and serves once the server comes up: its heartbeats reach the
// coordinator, its command subscription works, it generates.
func TestWorkerWaitsForNATS(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	url := "nats://127.0.0.1:" + strconv.Itoa(port)

	coord := control.NewNATSUser(control.RoleCoordinator, "")
	wu := control.NewNATSUser(control.RoleColocated, "colocated-late")
	o := testOptions(control.RoleColocated, url)
	o.ID = "colocated-late"
	o.NATS = passwordFile(t, wu)
	w := startWorker(t, o)
	if code, body := readyz(t, w); code != http.StatusServiceUnavailable || !strings.Contains(body, "NATS") {
		t.Errorf("/readyz without NATS: %d %q, want 503 naming NATS", code, body)
	}

	s, _, err := control.StartEmbedded("127.0.0.1:"+strconv.Itoa(port), control.WithUsers([]control.NATSUser{coord, wu}))
	if err != nil {
		t.Fatal(err)
	}
	// Stopped before the worker (cleanups run last first): the worker's
	// stop then finds NATS gone, which must not fail it.
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	co := coord.ConnOptions()
	co.ReconnectWait = 10 * time.Millisecond
	nc, err := co.Connect(url, "test-coordinator", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	m := control.NewMembership(time.Minute)
	stop, err := control.Watch(testCtx(t), nc, m, time.Now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	poll.CheckFor(t, 20*time.Second, 2*time.Millisecond, func() error {
		hb, ok := m.Get("colocated-late")
		if !ok {
			return errors.New("worker not a member")
		}
		if hb.GRPCAddr != w.Addr() || hb.Role != string(control.RoleColocated) {
			return fmt.Errorf("heartbeat %+v", hb)
		}
		if code, body := readyz(t, w); code != http.StatusOK {
			return fmt.Errorf("/readyz %d %q", code, body)
		}
		return nil
	})

	dc := pdservev1.NewDecodeServiceClient(dial(t, w))
	p := prompt(11, 2)
	gen, err := dc.Generate(testCtx(t), &pdservev1.GenerateRequest{RequestId: "late", PromptTokens: p, MaxTokens: 4, IgnoreEos: true, LocalPrefill: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := readGenerate(gen, 0)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(reference(t, p, 4), got.tokens); diff != "" {
		t.Errorf("tokens (-engine alone +worker):\n%s", diff)
	}

	// The command subscription made before NATS was up is registered.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := control.SendCommand(ctx, nc, "colocated", "colocated-late", control.Command{Kind: control.CmdDrain}); err != nil {
		t.Fatal(err)
	}
	if !w.Draining() {
		t.Error("not draining after the drain command")
	}
}

// A worker whose credentials NATS refuses stays not ready, retrying, and
// logs the refusal without its password.
func TestWorkerRefusedByNATS(t *testing.T) {
	coord := control.NewNATSUser(control.RoleCoordinator, "")
	s, url, err := control.StartEmbedded("127.0.0.1:-1", control.WithUsers([]control.NATSUser{coord}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })

	wrong := control.NewNATSUser(control.RoleDecode, "decode-x") // unknown to the server
	o := testOptions(control.RoleDecode, url)
	o.ID = "decode-x"
	o.NATS = passwordFile(t, wrong)
	core, logs := observer.New(zap.DebugLevel)
	log := zap.New(core)
	log.Info("effective configuration", o.LogFields()...)
	w, err := Start(testCtx(t), o, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Stop(context.Background()); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	poll.CheckFor(t, 10*time.Second, 2*time.Millisecond, func() error {
		for _, e := range logs.FilterMessageSnippet("nats connection attempt failed").All() {
			if strings.Contains(fmt.Sprint(e.ContextMap()["error"]), "uthorization") {
				return nil
			}
		}
		return errors.New("no refused connection attempt logged")
	})
	if code, _ := readyz(t, w); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz with refused credentials: %d, want 503", code)
	}
	for _, e := range logs.All() {
		text := e.Message + fmt.Sprint(e.ContextMap())
		if strings.Contains(text, wrong.Password) {
			t.Errorf("log reveals the password: %s", text)
		}
	}
	if logs.FilterField(zap.String("nats_password_file", o.NATS.PasswordFile)).Len() == 0 {
		t.Error("effective configuration lacks the password file's path")
	}
}
