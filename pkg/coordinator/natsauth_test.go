package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// observedLogger returns a logger that records everything and passes
// warnings and errors on to the test log.
func observedLogger(t *testing.T) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zap.DebugLevel)
	return zap.New(zapcore.NewTee(core, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)).Core())), logs
}

// waitLogged waits until an entry of logs contains every one of want in
// its message or fields.
func waitLogged(t *testing.T, logs *observer.ObservedLogs, want ...string) {
	t.Helper()
	waitFor(t, 10*time.Second, func() error {
		for _, e := range logs.All() {
			text := e.Message + fmt.Sprint(e.ContextMap())
			ok := true
			for _, w := range want {
				ok = ok && strings.Contains(text, w)
			}
			if ok {
				return nil
			}
		}
		return fmt.Errorf("no log entry with %q", want)
	})
}

// The standalone coordinator's embedded NATS server takes no one without
// credentials, and a worker-role user can neither command a worker nor
// pass for another one; each refusal is logged without a secret.
func TestStandaloneNATSIsAuthenticated(t *testing.T) {
	rogue := control.NewNATSUser(control.RoleDecode, "decode-rogue")
	log, logs := observedLogger(t)
	cl := startCluster(t, clusterOpts{log: log, edit: func(o *coordinator.Options) {
		o.NATSUsers = append(o.NATSUsers, rogue)
	}})
	url := cl.c.NATSURL()
	if strings.Contains(url, "@") {
		t.Errorf("NATS URL %s carries credentials", url)
	}

	if nc, err := nats.Connect(url); !errors.Is(err, nats.ErrAuthorization) {
		if err == nil {
			nc.Close()
		}
		t.Fatalf("connect without credentials: %v, want an authorization violation", err)
	}
	waitLogged(t, logs, "uthentication")

	orig, ok := cl.c.Membership().Get("decode-0")
	if !ok {
		t.Fatal("decode-0 not a member")
	}
	violations := make(chan error, 8)
	nc, err := nats.Connect(url, nats.UserInfo(rogue.User, rogue.Password),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	forged, _ := json.Marshal(control.Heartbeat{ID: "decode-0", Role: "decode", GRPCAddr: "10.6.6.6:1", Model: orig.Model})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name, subject string
		data          []byte
	}{
		{"heartbeat under another worker's id", control.HeartbeatSubject("decode", "decode-0"), forged},
		{"command", control.CommandSubject("decode", "decode-0"), []byte(`{"kind":"drain"}`)},
		{"plan", control.PlanSubject, []byte(`{}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := nc.Publish(tc.subject, tc.data); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-violations:
				if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), tc.subject) {
					t.Errorf("error %v, want a permission violation for %s", err, tc.subject)
				}
			case <-ctx.Done():
				t.Fatal("no permission violation")
			}
			waitLogged(t, logs, "Publish Violation", tc.subject)
		})
	}
	// The rogue's own subject with another worker's id in the payload:
	// NATS lets it through, the coordinator refuses it.
	if err := nc.Publish(control.HeartbeatSubject("decode", "decode-rogue"), forged); err != nil {
		t.Fatal(err)
	}
	waitLogged(t, logs, "heartbeat refused", "pdserve.hb.decode.decode-rogue")

	if hb, _ := cl.c.Membership().Get("decode-0"); hb.GRPCAddr != orig.GRPCAddr || hb.Draining {
		t.Errorf("decode-0 after the forgeries: %+v, want %+v", hb, orig)
	}
	if _, ok := cl.c.Membership().Get("decode-rogue"); ok {
		t.Error("the rogue joined")
	}
	for _, w := range cl.c.Workers() {
		if w.Draining() {
			t.Errorf("%s draining", w.ID())
		}
	}
	for _, e := range logs.All() {
		if text := e.Message + fmt.Sprint(e.ContextMap()); strings.Contains(text, rogue.Password) || strings.Contains(text, cl.natsObserver.Password) {
			t.Errorf("log reveals a password: %s", text)
		}
	}
}

// A coordinator whose external NATS server is not up yet starts, stays not
// ready, and becomes ready once the server and a worker are up.
func TestCoordinatorWaitsForExternalNATS(t *testing.T) {
	port := freePort(t)
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	coord := control.NewNATSUser(control.RoleCoordinator, "")
	wu := control.NewNATSUser(control.RoleColocated, "colocated-x")

	o := coordinator.DefaultOptions()
	o.HTTPAddr, o.NATSURL, o.Mode = "127.0.0.1:0", url, coordinator.ModeColocated
	o.NATS = coord.ConnOptions()
	o.NATS.ReconnectWait = 10 * time.Millisecond
	o.HeartbeatTTL = 2 * time.Second
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	c, err := coordinator.Start(context.Background(), o, testLogger(t))
	if err != nil {
		t.Fatalf("Start with NATS down: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := c.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	if err := c.Ready(); err == nil || !strings.Contains(err.Error(), "NATS") {
		t.Errorf("Ready with NATS down: %v, want not connected to NATS", err)
	}

	s, _, err := control.StartEmbedded("127.0.0.1:"+strconv.Itoa(port), control.WithUsers([]control.NATSUser{coord, wu}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	wo := workerrun.NewDecodeOptions()
	wo.Role, wo.ID, wo.GRPCAddr, wo.MetricsAddr, wo.NATSURL = control.RoleColocated, "colocated-x", "127.0.0.1:0", "", url
	wo.NATS = wu.ConnOptions()
	wo.NATS.ReconnectWait = 10 * time.Millisecond
	wo.HeartbeatInterval, wo.DrainTimeout = 20*time.Millisecond, 5*time.Second
	w, err := workerrun.Start(context.Background(), wo, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Stop(context.Background()); err != nil {
			t.Errorf("stop worker: %v", err)
		}
	})
	waitFor(t, 20*time.Second, c.Ready)
}
