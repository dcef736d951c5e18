package coordinator_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// TestWorkerShapeRefused: a real decode worker whose --block-tokens
// differs from the coordinator's (32, the deployment's 16) says so in its
// heartbeats and is refused, logged and counted by reason; one with the
// deployment's block size on the same NATS user joins and serves. Before,
// it joined and the prefix hashes and KV room estimate were silently
// wrong for it.
func TestWorkerShapeRefused(t *testing.T) {
	const user, password = "decode", "decode-password-0123456789"
	log, logs := observedLogger(t)
	cl := startCluster(t, clusterOpts{log: log, edit: func(o *coordinator.Options) {
		o.NATSUsers = append(o.NATSUsers, control.NATSUser{User: user, Password: password, Role: control.RoleDecode})
	}})
	start := func(id string, blockTokens int) *workerrun.Worker {
		t.Helper()
		wo := workerrun.NewDecodeOptions()
		wo.ID, wo.GRPCAddr, wo.MetricsAddr, wo.NATSURL = id, "127.0.0.1:0", "", cl.c.NATSURL()
		wo.NATS = control.NATSUser{User: user, Password: password, Role: control.RoleDecode}.ConnOptions()
		wo.HeartbeatInterval = 20 * time.Millisecond
		wo.Engine.Preset = "tiny"
		wo.Decode.BlockTokens = blockTokens
		wo.HashKey = clusterHashKey // the deployment's: only the block size differs
		w, err := workerrun.Start(context.Background(), wo, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := w.Stop(context.Background()); err != nil {
				t.Errorf("stop %s: %v", id, err)
			}
		})
		return w
	}
	start("decode-b32", 32)
	start("decode-b16", 16)
	waitFor(t, 20*time.Second, func() error {
		if _, ok := cl.c.Membership().Get("decode-b16"); !ok {
			return fmt.Errorf("decode-b16 (the deployment's block size) is not a member yet")
		}
		if n := counter(t, cl, "pdserve_coordinator_heartbeats_refused_total", "reason", "block_tokens"); n == 0 {
			return fmt.Errorf("no refusal counted for block_tokens")
		}
		return nil
	})
	if _, ok := cl.c.Membership().Get("decode-b32"); ok {
		t.Error("decode-b32 (--block-tokens 32) became a member of a --block-tokens 16 deployment")
	}
	found := false
	for _, e := range logs.FilterMessage("heartbeat refused").All() {
		if strings.Contains(fmt.Sprint(e.ContextMap()), "decode-b32") && strings.Contains(fmt.Sprint(e.ContextMap()), "--block-tokens 16") {
			found = true
		}
	}
	if !found {
		t.Error(`no "heartbeat refused" line names decode-b32 and the coordinator's --block-tokens`)
	}
	for i := range 4 {
		if r := complete(context.Background(), t, cl.url, request{Prompt: fmt.Sprintf("request %d", i), MaxTokens: 2, IgnoreEOS: true}); len(r.Tokens) != 2 {
			t.Fatalf("request %d: %d tokens, want 2", i, len(r.Tokens))
		}
	}
}

// TestBlockTokensTravel: a standalone deployment with --block-tokens 32
// gives its workers that block size, their heartbeats carry it, and
// prefix reuse works at that size (a second prompt sharing 64 tokens hits
// a multiple of 32).
func TestBlockTokensTravel(t *testing.T) {
	cl := startCluster(t, clusterOpts{edit: func(o *coordinator.Options) { o.BlockTokens = 32 }})
	for _, role := range []control.Role{control.RolePrefill, control.RoleDecode} {
		members := cl.c.Membership().Members(role)
		if len(members) == 0 {
			t.Fatalf("no %s member: nothing to check", role)
		}
		for _, hb := range members {
			if hb.BlockTokens != 32 {
				t.Errorf("%s heartbeat block_tokens %d, want 32", hb.ID, hb.BlockTokens)
			}
			if len(hb.Codecs) == 0 {
				t.Errorf("%s heartbeat lists no codecs", hb.ID)
			}
		}
	}
	prefix := strings.Repeat("abcdefgh", 8) // 64 byte-level tokens
	complete(context.Background(), t, cl.url, request{Prompt: prefix + " first", MaxTokens: 1, IgnoreEOS: true})
	var hit int
	waitFor(t, 10*time.Second, func() error {
		r := complete(context.Background(), t, cl.url, request{Prompt: prefix + " second", MaxTokens: 1, IgnoreEOS: true})
		v, _ := r.Budget["prefix_hit_tokens"].(float64)
		if hit = int(v); hit == 0 {
			return fmt.Errorf("no prefix hit yet")
		}
		return nil
	})
	if hit%32 != 0 || hit < 32 || hit > 64 {
		t.Errorf("prefix hit %d tokens, want a multiple of 32 up to 64", hit)
	}
}
