package coordinator_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// A decode worker that drains by migration (workerrun.Worker.MigrateAll)
// mid-stream: the request moves, KV included, to the other decode
// worker, and the client's stream goes on with the tokens of the engine
// alone, without a gap or a duplicate, as no recovery; every worker ends
// with its KV blocks free and nothing retained. It fails if the stream
// lost or repeated a token at the switch, or if the move was taken for
// a failure.
func TestLiveMigration(t *testing.T) {
	ref := newReference(t)
	for _, mode := range []string{coordinator.ModeDisaggregated, coordinator.ModeColocated} {
		t.Run(mode, func(t *testing.T) {
			checkNoLeaks(t)
			cl := startCluster(t, clusterOpts{mode: mode, decode: 2, gated: true})
			for _, g := range cl.gates {
				g.allow(4)
			}
			prompt := tokenizer.Bytes{}.Encode("move this request, please")
			want := ref.generate(t, prompt, 40, engine.Sampling{}, true)
			resp, toks := openStream(context.Background(), t, cl.url, request{Prompt: prompt, MaxTokens: 40, IgnoreEOS: true}, 3)
			defer resp.Body.Close()
			src := activeDecode(t, cl)
			for id, g := range cl.gates {
				if id != src {
					g.open()
				}
			}
			type res struct {
				n   int
				err error
			}
			done := make(chan res, 1)
			go func() {
				n, err := worker(cl, src).MigrateAll(context.Background())
				done <- res{n, err}
			}()
			// The source runs one step at a time until the migration took
			// the sequence (it has 36 steps left; the export waits for one
			// step boundary).
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
			rest, err := readStream(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if rest.Err != "" {
				t.Fatalf("stream failed: %s", rest.Err)
			}
			got := append(toks, rest.Tokens...)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("tokens (-engine alone +served with a migration):\n%s", diff)
			}
			if rec, _ := rest.Budget["recoveries"].(float64); rec != 0 || rest.Budget["decode_worker"] == src {
				t.Errorf("budget %v: want no recovery, the other decode worker", rest.Budget)
			}
			waitFor(t, 10*time.Second, func() error { return cl.idle(t) })
		})
	}
}
