package workerrun

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/control"
)

// TestRoleChangeRoutableAtFirstHeartbeat: a coordinator's view that
// admits workers (control.RequireAdmission with AdmitRoleMoves, as a
// plaintext coordinator's, here with no admitter at all after the first
// admission) counts the moved elastic worker as a member of its new role
// from the first heartbeat of that role it observes, both ways, and the
// worker then serves a request of that role, token-exact. Its heartbeats say elastic
// and keep the address in both roles, which AdmitRoleMoves needs. It
// fails when a role change drops the admission (the worker is then
// never routed to here: nobody admits it again), or when the heartbeats
// of the new role lose Elastic or change the address.
func TestRoleChangeRoutableAtFirstHeartbeat(t *testing.T) {
	c := startElasticCluster(t, -1)
	ctx := testCtx(t)
	m := control.NewMembership(time.Minute, control.RequireAdmission(), control.AdmitRoleMoves())
	stop, err := control.Watch(context.Background(), c.coord, m, time.Now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	poll.CheckFor(t, 20*time.Second, 5*time.Millisecond, func() error {
		if hb, ok := m.Get("e-0"); !ok || !m.Admit("e-0", string(control.RoleDecode), hb.GRPCAddr) {
			return fmt.Errorf("e-0 not admitted as decode: %+v", hb)
		}
		return nil
	})
	member := func(role control.Role) bool {
		return slices.ContainsFunc(m.Members(role), func(hb control.Heartbeat) bool { return hb.ID == "e-0" })
	}
	for i, to := range []control.Role{control.RolePrefill, control.RoleDecode} {
		from := control.RoleDecode
		if to == control.RoleDecode {
			from = control.RolePrefill
		}
		if err := control.SendCommand(ctx, c.coord, string(from), "e-0", control.Command{Kind: control.CmdRole, Arg: string(to)}); err != nil {
			t.Fatal(err)
		}
		// The first heartbeat of the new role, not draining, is the one
		// that must make it a member: Get and Members read the same
		// observation, and nothing here admits it again.
		poll.CheckFor(t, 20*time.Second, time.Millisecond, func() error {
			if hb, ok := m.Get("e-0"); !ok || hb.Role != string(to) || hb.Draining {
				return fmt.Errorf("e-0 not seen as %s yet: %+v", to, hb)
			}
			return nil
		})
		if !member(to) {
			hb, _ := m.Get("e-0")
			t.Fatalf("move %d: e-0's heartbeat says %s (elastic %v), but it is no %s member: it waits for another admission", i, hb.Role, hb.Elastic, to)
		}
		if member(from) {
			t.Errorf("move %d: e-0 is still a %s member", i, from)
		}
		p := prompt(20, int32(40+i))
		id := fmt.Sprint("after-move-", i)
		if to == control.RolePrefill {
			s, err := start(ctx, c.epc, c.dc, c.d.Addr(), id, p, 3)
			if err != nil {
				t.Fatalf("prefill on the moved worker: %v", err)
			}
			s.finish(t, id, 3)
		} else {
			s, err := start(ctx, c.pc, c.edc, c.e.Addr(), id, p, 3)
			if err != nil {
				t.Fatalf("decode on the moved worker: %v", err)
			}
			s.finish(t, id, 3)
		}
	}
}
