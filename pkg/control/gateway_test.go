package control

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pdserve/pdserve/internal/poll"
)

// Two regions, each an embedded server behind its gateway server: a
// region subject published in one reaches a subscriber in the other, and
// nothing else crosses (a command subject stays in its region).
func TestGatewayCarriesOnlyRegionSubjects(t *testing.T) {
	worker := NewNATSUser(RoleDecode, "w1")
	var ncW *nats.Conn
	start := func(name string, remotes map[string][]*url.URL) (*Gateway, *nats.Conn) {
		t.Helper()
		g, err := StartGateway(name, "127.0.0.1:0", remotes, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Shutdown)
		u := NewNATSUser(RoleCoordinator, "")
		s, addr, err := StartEmbedded("127.0.0.1:-1", WithUsers([]NATSUser{u, worker}), WithLeafRemote(g), WithJetStream(t.TempDir(), 1<<20))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		nc, err := nats.Connect(addr, nats.UserInfo(u.User, u.Password))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		if ncW == nil {
			if ncW, err = nats.Connect(addr, nats.UserInfo(worker.User, worker.Password)); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(ncW.Close)
		}
		return g, nc
	}
	ga, ncA := start("a", nil)
	_, ncB := start("b", map[string][]*url.URL{"a": {{Scheme: "nats", Host: ga.Addr()}}})

	region := make(chan string, 16)
	cmd := make(chan string, 16)
	if _, err := ncB.Subscribe(RegionPrefix+"test", func(m *nats.Msg) { region <- string(m.Data) }); err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{CommandSubject("decode", "w1"), HeartbeatWildcard, ">"} {
		if _, err := ncB.Subscribe(subj, func(m *nats.Msg) {
			if !strings.HasPrefix(m.Subject, RegionPrefix) {
				cmd <- m.Subject
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ncB.Flush(); err != nil {
		t.Fatal(err)
	}
	poll.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		_ = ncA.Publish(CommandSubject("decode", "w1"), []byte("drain"))
		if err := ncA.Publish(RegionPrefix+"test", []byte("hello")); err != nil {
			return err
		}
		select {
		case <-region:
			return nil
		case <-time.After(50 * time.Millisecond):
			return errors.New("not yet")
		}
	})
	// A command and then a region message, on one connection: had the
	// command crossed, it would have arrived first.
	_ = ncA.Publish(CommandSubject("decode", "w1"), []byte("drain"))
	_ = ncW.Publish(HeartbeatSubject("decode", "w1"), []byte("{}"))
	_ = ncW.Flush()
	if err := ncA.Publish(RegionPrefix+"test", []byte("marker")); err != nil {
		t.Fatal(err)
	}
	for m := range region {
		if m == "marker" {
			break
		}
	}
	select {
	case m := <-cmd:
		t.Errorf("a command subject crossed the gateway: %q", m)
	default:
	}
}
