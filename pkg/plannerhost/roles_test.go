package plannerhost

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/control"
)

// TestRoleMoverPicksElasticLeastLoaded: the planner's role moves go to
// elastic workers of the old role, least loaded first, never to a
// draining one or one that cannot change role; a shortfall is an error
// after the moves there are.
func TestRoleMoverPicksElasticLeastLoaded(t *testing.T) {
	m := control.NewMembership(time.Minute)
	now := time.Now()
	for _, hb := range []control.Heartbeat{
		{ID: "p-busy", Role: "prefill", Elastic: true, QueuedPrefillTokens: 900},
		{ID: "p-idle", Role: "prefill", Elastic: true},
		{ID: "p-fixed", Role: "prefill"},
		{ID: "p-draining", Role: "prefill", Elastic: true, Draining: true},
		{ID: "d-0", Role: "decode", Elastic: true},
	} {
		hb.GRPCAddr, hb.Model = "10.0.0.1:9000", "m"
		if err := m.Observe(hb, now); err != nil {
			t.Fatal(err)
		}
	}
	var sent []string
	mv := roleMover{members: m, log: zap.NewNop(), command: func(_ context.Context, role, id string, c control.Command) error {
		sent = append(sent, fmt.Sprintf("%s %s %s→%s", c.Kind, id, role, c.Arg))
		return nil
	}}
	if err := mv.MoveRoles(context.Background(), "prefill", "decode", 1); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"role p-idle prefill→decode"}, sent); diff != "" {
		t.Errorf("commands (-want +got):\n%s", diff)
	}
	sent = nil
	err := mv.MoveRoles(context.Background(), "prefill", "decode", 3)
	if err == nil || !strings.Contains(err.Error(), "2 elastic prefill workers to move to decode, want 3") {
		t.Errorf("shortfall: %v", err)
	}
	if diff := cmp.Diff([]string{"role p-idle prefill→decode", "role p-busy prefill→decode"}, sent); diff != "" {
		t.Errorf("commands (-want +got):\n%s", diff)
	}
	mv.command = func(context.Context, string, string, control.Command) error { return errors.New("no reply") }
	if err := mv.MoveRoles(context.Background(), "decode", "prefill", 1); err == nil || !strings.Contains(err.Error(), "no reply") {
		t.Errorf("failed command: %v", err)
	}
}
