package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// An elastic decode worker holding running streams gets the coordinator's
// role command to prefill (standalone.WithElasticWorkers, control.CmdRole
// on the coordinator's NATS connection). With Migrate its sequences move
// to the other decode worker, which pulls their KV (no KV computed):
// every client stream equals the engine's greedy output alone, token for
// token, served by the other decode worker and without a recovery. Without Migrate they finish on it before it changes. Either
// way every worker ends with no KV held, and the moved worker then
// prefills a request in its new role (the other prefill worker drained),
// which the first-request histogram counts, routed from the first
// heartbeat of its new role without a second admission (it fails when
// a role change drops the admission). The migrate case fails when
// ChangeRole ignores the command's Migrate (the streams then finish on
// the source: decode_worker is the moved worker, no pull logged), and
// when the coordinator gives the pull no credential it may present
// (signed credentials: the KV is then computed).
func TestElasticRoleChange(t *testing.T) {
	ref := newReference(t)
	prompts := [][]int32{
		tokenizer.Bytes{}.Encode("move this request, please"),
		tokenizer.Bytes{}.Encode("and this one, while it runs"),
	}
	const maxTokens = 40
	var wants [][]int32
	for _, p := range prompts {
		wants = append(wants, ref.generate(t, p, maxTokens, engine.Sampling{}, true))
	}
	for _, migrate := range []bool{true, false} {
		t.Run(fmt.Sprintf("migrate=%v", migrate), func(t *testing.T) {
			checkNoLeaks(t)
			cmdr := &commander{}
			obs, logs := observer.New(zap.DebugLevel)
			log := testLogger(t).WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return zapcore.NewTee(c, obs) }))
			cl := startCluster(t, clusterOpts{decode: 2, gated: true, elastic: true, log: log,
				edit: func(o *coordinator.Options) {
					o.Extensions = append(o.Extensions, cmdr)
				}})
			for _, g := range cl.gates {
				g.allow(4)
			}
			type stream struct {
				resp *http.Response
				toks []int32
			}
			var streams []stream
			resp, toks := openStream(context.Background(), t, cl.url, request{Prompt: prompts[0], MaxTokens: maxTokens, IgnoreEOS: true}, 3)
			defer resp.Body.Close()
			streams = append(streams, stream{resp, toks})
			src := activeDecode(t, cl)
			g := cl.gates[src]
			g.allow(8) // the second stream may join the first on src
			resp, toks = openStream(context.Background(), t, cl.url, request{Prompt: prompts[1], MaxTokens: maxTokens, IgnoreEOS: true}, 3)
			defer resp.Body.Close()
			streams = append(streams, stream{resp, toks})
			for id, g := range cl.gates {
				if id != src {
					g.open()
				}
			}
			isPrefill := func() bool {
				hb, ok := cl.c.Membership().Get(src)
				return ok && hb.Role == string(control.RolePrefill) && !hb.Draining
			}
			cmd := control.Command{Kind: control.CmdRole, Arg: string(control.RolePrefill), Migrate: migrate}
			if err := cmdr.host.Command(context.Background(), string(control.RoleDecode), src, cmd); err != nil {
				t.Fatal(err)
			}
			if migrate {
				// src runs one step at a time until it changed role: the
				// export of its sequences waits for a step boundary, and
				// they have more than 20 steps left each.
				for !isPrefill() {
					before := g.steps.Load()
					g.allow(1)
					waitFor(t, 10*time.Second, func() error {
						if g.steps.Load() > before || isPrefill() {
							return nil
						}
						return errors.New("the source ran no step and did not change role")
					})
				}
			}
			g.open()
			for i, s := range streams {
				rest, err := readStream(s.resp.Body)
				if err != nil {
					t.Fatal(err)
				}
				if rest.Err != "" {
					t.Fatalf("stream %d failed: %s", i, rest.Err)
				}
				if diff := cmp.Diff(wants[i], append(s.toks, rest.Tokens...)); diff != "" {
					t.Errorf("stream %d tokens (-engine alone +served across the role change):\n%s", i, diff)
				}
				dw, _ := rest.Budget["decode_worker"].(string)
				if rec, _ := rest.Budget["recoveries"].(float64); rec != 0 {
					t.Errorf("stream %d: budget %v, want no recovery", i, rest.Budget)
				}
				switch {
				case migrate && dw == src:
					t.Errorf("stream %d finished on %s, which was ordered to migrate its sequences away", i, src)
				case !migrate && i == 0 && dw != src:
					t.Errorf("stream %d finished on %q, want %s (no migration)", i, dw, src)
				}
			}
			// The moved sequences' KV was pulled from src, not computed.
			if n := logs.FilterMessage("migration pulled").Len(); migrate && n == 0 || !migrate && n != 0 {
				t.Errorf("%d migration pulls logged, want some exactly when migrating", n)
			}
			for _, e := range logs.FilterMessageSnippet("computing the sequence's kv").All() {
				t.Errorf("a moved sequence's KV was computed: %s %v", e.Message, e.ContextMap())
			}
			waitFor(t, 20*time.Second, func() error {
				if !isPrefill() {
					return fmt.Errorf("%s has not joined the prefill pool", src)
				}
				return nil
			})
			waitFor(t, 10*time.Second, func() error { return cl.idle(t) })

			// The moved worker prefills the next request: the other
			// prefill worker drains.
			for _, w := range cl.c.Workers() {
				if w.Role() == control.RolePrefill && w.ID() != src {
					w.Drain()
				}
			}
			waitFor(t, 10*time.Second, func() error {
				if hbs := cl.c.Membership().Members(control.RolePrefill); len(hbs) != 1 || hbs[0].ID != src {
					return fmt.Errorf("prefill workers routed to: %v, want %s alone", hbs, src)
				}
				return nil
			})
			// Routed from the first heartbeat of its new role: this
			// plaintext coordinator admitted it once, as decode
			// (control.AdmitRoleMoves), not again as prefill.
			for _, e := range logs.FilterMessageSnippet("worker admitted").All() {
				if f := e.ContextMap(); f["worker"] == src && f["role"] == string(control.RolePrefill) {
					t.Errorf("%s was admitted again in its new role (%s): it waited for a probe after its heartbeat", src, e.Message)
				}
			}
			res := complete(context.Background(), t, cl.url, request{Prompt: "served in the new role", MaxTokens: 4, IgnoreEOS: true})
			if res.Err != "" {
				t.Fatalf("request after the role change: %s", res.Err)
			}
			if pw, _ := res.Budget["prefill_worker"].(string); pw != src {
				t.Errorf("prefilled on %q, want %s in its new role", pw, src)
			}
			if n := histCount(t, cl.c.Registry(), "pdserve_worker_role_change_first_request_seconds", src); n != 1 {
				t.Errorf("first-request histogram of %s counts %d, want 1", src, n)
			}
			waitFor(t, 10*time.Second, func() error { return cl.idle(t) })
		})
	}
}

// histCount returns the sample count of a gathered histogram with label
// worker=id (0: none).
func histCount(t testing.TB, g prometheus.Gatherer, name, worker string) uint64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "worker" && l.GetValue() == worker {
					n += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return n
}

// commander is an Extension that keeps the coordinator's Host, to send
// commands on the coordinator's own NATS connection (as its planner does).
type commander struct{ host coordinator.Host }

func (c *commander) Attach(h coordinator.Host) error { c.host = h; return nil }
func (*commander) ObserveTrace(*budget.Trace)        {}
func (*commander) Run(ctx context.Context)           { <-ctx.Done() }
