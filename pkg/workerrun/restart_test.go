package workerrun

import (
	"fmt"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/control"
)

// TestRoleChangeRestart moves an elastic worker whose role changes stand
// for a Deployment's pod replacement: it stays out of service (draining)
// for the restart before it serves its new role. Without the restart
// (the mutation: the option ignored) the change takes a few
// milliseconds, and the draining heartbeat is gone at once.
func TestRoleChangeRestart(t *testing.T) {
	const restart = 1500 * time.Millisecond
	eu := control.NewNATSUser(control.RoleElastic, "e-0")
	coord := control.NewNATSUser(control.RoleCoordinator, "")
	s, url, err := control.StartEmbedded("127.0.0.1:-1", control.WithUsers([]control.NATSUser{coord, eu}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	eo := testOptions(control.RoleDecode, url)
	eo.ID, eo.NATS, eo.Elastic, eo.RoleChangeRestart = "e-0", eu.ConnOptions(), true, restart
	e := startWorker(t, eo)

	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- e.ChangeRole(control.RolePrefill, time.Time{}, true) }()
	select {
	case err := <-done:
		t.Fatalf("the change returned after %v (err %v), before the restart of %v", time.Since(start), err, restart)
	case <-time.After(restart / 2):
	}
	// Half-way through the restart: still draining the old role.
	if hb := e.heartbeat(); !hb.Draining || hb.Role != string(control.RoleDecode) {
		t.Errorf("during the restart: role %s, draining %v; want decode, draining", hb.Role, hb.Draining)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < restart {
		t.Errorf("the change took %v, less than the restart %v", took, restart)
	}
	poll.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if hb := e.heartbeat(); hb.Role != string(control.RolePrefill) || hb.Draining {
			return fmt.Errorf("role %s, draining %v; want prefill, serving", hb.Role, hb.Draining)
		}
		return nil
	})
}
