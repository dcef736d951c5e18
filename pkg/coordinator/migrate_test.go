package coordinator_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// A decode worker that drains by migration (workerrun.Worker.MigrateAll)
// mid-stream: the request moves, KV included, to the other decode
// worker, and the client's stream goes on with the tokens of the engine
// alone, without a gap or a duplicate, as no recovery; every worker ends
// with its KV blocks free and nothing retained. It fails if the stream
// lost or repeated a token at the switch, if the move was taken for a
// failure, or if the target computed the sequence's KV instead of
// pulling it.
func TestLiveMigration(t *testing.T) {
	ref := newReference(t)
	for _, mode := range []string{coordinator.ModeDisaggregated, coordinator.ModeColocated} {
		t.Run(mode, func(t *testing.T) {
			checkNoLeaks(t)
			cl := startCluster(t, clusterOpts{mode: mode, decode: 2, gated: true})
			migrateMidStream(t, ref, cl)
			// The target pulled the sequence's KV from the source: the
			// in-process workers may pull from each other.
			if got := counter(t, cl, "pdserve_decode_migration_pulls_total", "result", "pulled"); got != 1 {
				t.Errorf("migration pulls %v, want 1 pulled", got)
			}
		})
	}
}

// With static gRPC tokens a decode worker pulls a migrated sequence's KV
// with the prefill token when it holds the token itself (the chart's
// decode pool beside an elastic one), and computes it when it holds only
// the token's digest (the decode pool of a chart without one): the
// source refuses a pull without the prefill role. The stream is the
// engine's alone either way. It fails if a decode worker holding the
// token did not send it on its pull.
func TestLiveMigrationTokens(t *testing.T) {
	ref := newReference(t)
	const coordToken, prefillToken = "migration-coordinator-token-0123456789", "migration-prefill-token-0123456789abc"
	sum := sha256.Sum256([]byte(prefillToken))
	for _, tc := range []struct {
		name, decodeHolds string
		want              string // the result counted
	}{
		{"decode workers hold the prefill token", prefillToken, "pulled"},
		{"decode workers hold its digest", "sha256:" + hex.EncodeToString(sum[:]), "computed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeaks(t)
			cl := startCluster(t, clusterOpts{decode: 2, gated: true,
				edit: func(o *coordinator.Options) { o.GRPCAuth.Token, o.GRPCAuth.PrefillToken = coordToken, prefillToken },
				worker: func(o *workerrun.Options) {
					if o.Role == control.RoleDecode {
						o.GRPCAuth.PrefillToken = tc.decodeHolds
					}
				}})
			migrateMidStream(t, ref, cl)
			if got := counter(t, cl, "pdserve_decode_migration_pulls_total", "result", tc.want); got != 1 {
				t.Errorf("migration pulls %s: %v, want 1", tc.want, got)
			}
		})
	}
}

// migrateMidStream opens a 40-token greedy stream on cl (two gated decode
// workers), drains its decode worker by migration
// (workerrun.Worker.MigrateAll) after 3 tokens, and checks the rest of
// the stream: the engine alone's tokens, served by the other decode
// worker, no recovery; then every worker idle.
func migrateMidStream(t *testing.T, ref *reference, cl *cluster) {
	t.Helper()
	resp, toks, want, src := gatedStream(t, ref, cl, "move this request, please")
	defer resp.Body.Close()
	type res struct {
		n   int
		err error
	}
	done := make(chan res, 1)
	go func() {
		n, err := worker(cl, src).MigrateAll(context.Background())
		done <- res{n, err}
	}()
	// The source runs one step at a time until the migration took the
	// sequence (it has 36 steps left; the export waits for one step
	// boundary).
	g := cl.gates[src]
	var r res
	for got := false; !got; {
		select {
		case r = <-done:
			got = true
			continue
		default:
		}
		before := g.steps.Load()
		g.allow(1)
		waitFor(t, 5*time.Second, func() error {
			if g.steps.Load() > before || len(done) > 0 {
				return nil
			}
			return errors.New("the source ran no step")
		})
	}
	g.open()
	if r.err != nil || r.n != 1 {
		t.Fatalf("MigrateAll: %d moved, %v", r.n, r.err)
	}
	rest, _ := checkRest(t, resp, toks, want, "a migration")
	if rec, _ := rest.Budget["recoveries"].(float64); rec != 0 || rest.Budget["decode_worker"] == src {
		t.Errorf("budget %v: want no recovery, the other decode worker", rest.Budget)
	}
	waitFor(t, 10*time.Second, func() error { return cl.idle(t) })
}
