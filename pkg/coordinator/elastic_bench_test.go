package coordinator_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// BenchmarkElasticRoleChange measures a role change of an elastic decode
// worker to prefill, ordered with Migrate while it holds one running
// stream (reference engine, tiny preset, 1 prefill and 2 decode workers,
// in process, with static gRPC tokens (the moved KV is pulled) and with
// signed credentials (it is computed); each decode worker paced to one step per benchPace, so
// that the stream is still running when the command comes):
//
//   - cmd-to-served-ms: from sending the role command (NATS) until the
//     first request the worker prefilled in its new role returned (sent
//     as soon as the coordinator routes prefills to it; the other prefill
//     worker drains first);
//   - cmd-to-routable-ms: until the coordinator routes prefills to it;
//   - first-request-ms: the worker's own histogram, from the command's
//     arrival to its first call in the new role;
//   - max-gap-ms: the largest time between two token events of the
//     moved stream, at the client; base-gap-ms, its median (the pace).
//
// Each iteration starts a fresh deployment (not timed):
//
//	go test -run '^$' -bench ElasticRoleChange -benchtime 5x ./pkg/coordinator/
func BenchmarkElasticRoleChange(b *testing.B) {
	for _, mode := range []struct {
		name   string
		tokens bool
	}{{"kv-pulled/token-auth", true}, {"kv-computed/signed-auth", false}} {
		b.Run(mode.name, func(b *testing.B) { benchRoleChange(b, mode.tokens) })
	}
}

// benchRoleChange is BenchmarkElasticRoleChange with static gRPC tokens
// (the target pulls the moved KV with the prefill token) or with the
// generated signing key (the coordinator gives the migration pull no
// credential: the target computes the KV).
func benchRoleChange(b *testing.B, tokens bool) {
	const benchPace = 5 * time.Millisecond
	var served, routable, first, maxGap, baseGap float64
	for i := range b.N {
		b.StopTimer()
		cmdr := &commander{}
		cl := startCluster(b, clusterOpts{decode: 2, gated: true, elastic: true,
			edit: func(o *coordinator.Options) {
				o.Extensions = append(o.Extensions, cmdr)
				if tokens {
					o.GRPCAuth.Token, o.GRPCAuth.PrefillToken = "elastic-bench-token-0123456789abcdef", "elastic-bench-prefill-token-0123456789"
				}
			}})
		stop := make(chan struct{})
		paced := make(chan struct{})
		go func() {
			defer close(paced)
			tick := time.NewTicker(benchPace)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				for _, g := range cl.gates {
					if len(g.gate) == 0 {
						g.gate <- struct{}{}
					}
				}
			}
		}()
		// Runs before startCluster's cleanup opens (closes) the gates.
		b.Cleanup(func() {
			close(stop)
			<-paced
		})

		prompt := tokenizer.Bytes{}.Encode(fmt.Sprintf("a stream that moves, run %d", i))
		body, _ := json.Marshal(request{Prompt: prompt, MaxTokens: 200, IgnoreEOS: true, Stream: true, ReturnTokenIDs: true})
		resp, err := http.Post(cl.url+"/v1/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			b.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
		type timed struct {
			times  []time.Time
			budget map[string]any
			err    error
		}
		got := make(chan timed, 1)
		tokens := make(chan int, 1024)
		go func() {
			defer resp.Body.Close()
			times, budget, err := timedStream(resp.Body, tokens)
			got <- timed{times, budget, err}
		}()
		for n := 0; n < 10; {
			select {
			case k := <-tokens:
				n += k
			case r := <-got:
				b.Fatalf("the stream ended after %d token events: %v", len(r.times), r.err)
			}
		}
		src := ""
		waitFor(b, 5*time.Second, func() error {
			for id := range cl.gates {
				free, _ := gauge(b, cl.c.Registry(), "pdserve_kv_blocks_free", id)
				total, _ := gauge(b, cl.c.Registry(), "pdserve_kv_blocks_capacity", id)
				if free < total {
					src = id
					return nil
				}
			}
			return fmt.Errorf("no decode worker holds the stream")
		})
		for _, w := range cl.c.Workers() {
			if w.Role() == control.RolePrefill {
				w.Drain()
			}
		}
		waitFor(b, 5*time.Second, func() error {
			if n := len(cl.c.Membership().Members(control.RolePrefill)); n != 0 {
				return fmt.Errorf("%d prefill workers routed to", n)
			}
			return nil
		})

		b.StartTimer()
		t0 := time.Now()
		cmd := control.Command{Kind: control.CmdRole, Arg: string(control.RolePrefill), Migrate: true}
		if err := cmdr.host.Command(context.Background(), string(control.RoleDecode), src, cmd); err != nil {
			b.Fatal(err)
		}
		for {
			if hbs := cl.c.Membership().Members(control.RolePrefill); len(hbs) == 1 && hbs[0].ID == src {
				break
			}
			time.Sleep(time.Millisecond)
		}
		tRoutable := time.Since(t0)
		res := complete(context.Background(), b, cl.url, request{Prompt: "served in the new role", MaxTokens: 1, IgnoreEOS: true})
		tServed := time.Since(t0)
		b.StopTimer()
		if res.Err != "" || res.Budget["prefill_worker"] != src {
			b.Fatalf("request after the role change: %q, budget %v, want prefilled on %s", res.Err, res.Budget, src)
		}
		r := <-got
		if r.err != nil {
			b.Fatal(r.err)
		}
		if dw := r.budget["decode_worker"]; dw == src {
			b.Fatalf("the stream finished on %s, which migrated its sequences", src)
		}
		var gaps []time.Duration
		for j := 1; j < len(r.times); j++ {
			gaps = append(gaps, r.times[j].Sub(r.times[j-1]))
		}
		slices.Sort(gaps)
		served += tServed.Seconds() * 1e3
		routable += tRoutable.Seconds() * 1e3
		first += histSum(b, cl, "pdserve_worker_role_change_first_request_seconds", src) * 1e3
		maxGap += gaps[len(gaps)-1].Seconds() * 1e3
		baseGap += gaps[len(gaps)/2].Seconds() * 1e3
	}
	n := float64(b.N)
	b.ReportMetric(served/n, "cmd-to-served-ms")
	b.ReportMetric(routable/n, "cmd-to-routable-ms")
	b.ReportMetric(first/n, "first-request-ms")
	b.ReportMetric(maxGap/n, "max-gap-ms")
	b.ReportMetric(baseGap/n, "base-gap-ms")
}

// timedStream reads an SSE completion stream and returns the arrival
// time of each event that carries tokens and the last pdserve object; it
// sends each such event's token count on tokens (never blocking).
func timedStream(body io.Reader, tokens chan<- int) ([]time.Time, map[string]any, error) {
	var times []time.Time
	var budget map[string]any
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				TokenIDs []int32 `json:"token_ids"`
			} `json:"choices"`
			PDServe map[string]any `json:"pdserve"`
			Error   *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			return nil, nil, err
		}
		if ch.Error != nil {
			return nil, nil, fmt.Errorf("stream failed: %s", ch.Error.Message)
		}
		n := 0
		for _, c := range ch.Choices {
			n += len(c.TokenIDs)
		}
		if n > 0 {
			times = append(times, time.Now())
			select {
			case tokens <- n:
			default:
			}
		}
		if ch.PDServe != nil {
			budget = ch.PDServe
		}
	}
	return times, budget, sc.Err()
}

// histSum returns the sum of a gathered histogram's samples with label
// worker=id.
func histSum(b *testing.B, cl *cluster, name, worker string) float64 {
	b.Helper()
	mfs, err := cl.c.Registry().Gather()
	if err != nil {
		b.Fatal(err)
	}
	var s float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "worker" && l.GetValue() == worker {
					s += m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return s
}
