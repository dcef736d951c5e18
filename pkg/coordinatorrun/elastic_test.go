package coordinatorrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/control"
)

// TestStandaloneElasticFlag: coordinator --standalone --elastic starts
// its workers elastic (their heartbeats say so), and a role command on
// the coordinator's subject (here from an operator's coordinator user of
// --nats-auth-file) moves a decode worker to prefill: its heartbeat
// carries the new role. The coordinator then stops cleanly, leaving no
// goroutine. It fails without the flag's way to the workers (a worker
// not elastic refuses the command, and its heartbeat says elastic
// false).
func TestStandaloneElasticFlag(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	users := filepath.Join(t.TempDir(), "users.yaml")
	const pw = "op-password-0123456789"
	if err := os.WriteFile(users, []byte("users:\n  - {user: operator, password: "+pw+", role: coordinator}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	args := []string{"--standalone", "--elastic", "--decode-workers=2", "--http-addr=127.0.0.1:0", "--nats-listen=127.0.0.1:-1", "--nats-auth-file", users}
	var out bytes.Buffer
	code := make(chan int, 1)
	go func() {
		code <- mainWith(ctx, args, &out, &out, func(string) (*zap.Logger, error) { return zap.New(core), nil })
	}()
	stopped := false
	defer func() {
		if !stopped {
			cancel()
			<-code
		}
	}()

	var url string
	poll.CheckFor(t, 60*time.Second, 10*time.Millisecond, func() error {
		select {
		case c := <-code:
			stopped = true
			t.Fatalf("coordinator exited %d: %s", c, out.String())
		default:
		}
		for _, e := range logs.FilterMessage("embedded NATS server started").All() {
			url, _ = e.ContextMap()["url"].(string)
		}
		if url == "" {
			return errors.New("no embedded NATS server yet")
		}
		return nil
	})
	nc, err := nats.Connect(url, nats.UserInfo("operator", pw))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	m := control.NewMembership(time.Minute)
	stopWatch, err := control.Watch(context.Background(), nc, m, time.Now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer stopWatch()
	var moved string
	poll.CheckFor(t, 60*time.Second, 10*time.Millisecond, func() error {
		all := m.All()
		if len(all) != 3 {
			return fmt.Errorf("%d workers, want 3", len(all))
		}
		for _, hb := range all {
			if !hb.Elastic {
				return fmt.Errorf("worker %s (%s) is not elastic", hb.ID, hb.Role)
			}
			if hb.Role == string(control.RoleDecode) {
				moved = hb.ID
			}
		}
		return nil
	})
	cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer ccancel()
	if err := control.SendCommand(cctx, nc, string(control.RoleDecode), moved, control.Command{Kind: control.CmdRole, Arg: string(control.RolePrefill)}); err != nil {
		t.Fatalf("role command to %s: %v", moved, err)
	}
	poll.CheckFor(t, 60*time.Second, 10*time.Millisecond, func() error {
		if hb, _ := m.Get(moved); hb.Role != string(control.RolePrefill) || hb.Draining {
			return fmt.Errorf("%s: role %s, draining %v; want prefill", moved, hb.Role, hb.Draining)
		}
		return nil
	})
	cfg := logs.FilterMessage("effective configuration").All()
	if len(cfg) != 1 || cfg[0].ContextMap()["elastic"] != true {
		t.Errorf("effective configuration lines %d, want one with elastic true", len(cfg))
	}

	stopWatch()
	nc.Close()
	cancel()
	stopped = true
	if c := <-code; c != 0 {
		var errs []string
		for _, e := range logs.FilterLevelExact(zap.ErrorLevel).All() {
			errs = append(errs, fmt.Sprintf("%s %v", e.Message, e.ContextMap()))
		}
		t.Errorf("coordinator exited %d after its stop: %s\nerror logs: %q", c, out.String(), errs)
	}
}
