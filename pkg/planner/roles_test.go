package planner

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pdserve/pdserve/pkg/perfmodel"
)

// mixObs is a request of in/out tokens as the model times it alone, with
// a TTFT of ttft.
func mixObs(arrival time.Time, in, out int, ttft time.Duration) Observation {
	return Observation{Arrival: arrival, PromptTokens: in, OutputTokens: out, TTFT: ttft, TPOT: 10 * time.Millisecond}
}

// recordMoves is a RoleActuator that records its calls.
type recordMoves struct {
	mu    sync.Mutex
	calls []string
}

func (r *recordMoves) MoveRoles(_ context.Context, from, to string, n int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, fmt.Sprintf("%d %s→%s", n, from, to))
	return nil
}

// TestOnlineRoleMoves: four elastic workers, 2P+2D, under a mix of long
// prompts and short answers, then short prompts and long answers, at a
// rate their total serves. The planner moves a worker to prefill, then
// after the shift workers to decode, one move per minimum dwell, with
// a predicted gain above the threshold, never leaves a role without a worker, never changes the total,
// and reports the measured effect of a move one window after it.
func TestOnlineRoleMoves(t *testing.T) {
	cfg := onlineConfig(t)
	cfg.Roles = RoleOptions{Enabled: true, MinDwell: 4 * time.Minute, MinGain: 0.02}
	cfg.Base.GPUBudget = 4
	act := &recordMoves{}
	cfg.RoleActuator = act
	reg := prometheus.NewRegistry()
	o, err := NewOnline(cfg, reg)
	if err != nil {
		t.Fatal(err)
	}
	o.SetCurrent(2, 2)
	rng := rand.New(rand.NewPCG(3, 4))
	phases := []struct {
		until   time.Duration
		in, out int
		rate    float64
	}{{16 * time.Minute, 3000, 16, 6}, {32 * time.Minute, 128, 700, 4.5}}
	var moves []RoleDecision
	var moveTimes []time.Time
	var effects []RoleEffect
	var log []string
	next, now := t0, t0
	ctx := context.Background()
	for _, ph := range phases {
		for ; now.Before(t0.Add(ph.until)); now = now.Add(10 * time.Second) {
			for ; next.Before(now.Add(-time.Second)); next = next.Add(time.Duration(rng.ExpFloat64() / ph.rate * 1e9)) {
				o.Observe(mixObs(next, ph.in, ph.out, 100*time.Millisecond))
			}
			d, ok := o.Tick(now)
			if !ok {
				continue
			}
			r := d.Roles
			if r == nil {
				t.Fatalf("%v: no role decision", now.Sub(t0))
			}
			log = append(log, fmt.Sprintf("%5v %dP+%dD → %dP+%dD predicted %.3f → %.3f (%s)", now.Sub(t0), r.CurrentPrefill, r.CurrentDecode,
				r.Prefill, r.Decode, r.PredictedBefore, r.PredictedAfter, r.Reason))
			if r.Prefill < 1 || r.Decode < 1 || r.Prefill+r.Decode != 4 {
				t.Errorf("%v: split %dP+%dD", now.Sub(t0), r.Prefill, r.Decode)
			}
			if d.Changed {
				t.Errorf("%v: the total changed (%dP+%dD, %s)", now.Sub(t0), d.PrefillReplicas, d.DecodeReplicas, d.Reason)
			}
			if r.Effect != nil {
				effects = append(effects, *r.Effect)
			}
			if r.Changed {
				moves = append(moves, *r)
				moveTimes = append(moveTimes, now)
				if r.PredictedGain < cfg.Roles.MinGain {
					t.Errorf("%v: a move for a gain of %.3f", now.Sub(t0), r.PredictedGain)
				}
				if err := act.MoveRoles(ctx, r.From, r.To, r.Moved); err != nil {
					t.Fatal(err)
				}
				o.SetCurrent(r.Prefill, r.Decode) // the workers changed role
			}
		}
	}
	t.Logf("role decisions:\n%s", strings.Join(log, "\n"))
	if len(moves) < 2 || moves[0].To != "prefill" {
		t.Fatalf("moves %+v, want one to prefill, then to decode", moves)
	}
	for i, m := range moves[1:] {
		if m.To != "decode" || moveTimes[i+1].Before(t0.Add(phases[0].until)) {
			t.Errorf("move %d at %v: %+v, want to decode after the shift", i+1, moveTimes[i+1].Sub(t0), m)
		}
		if gap := moveTimes[i+1].Sub(moveTimes[i]); gap < cfg.Roles.MinDwell {
			t.Errorf("moves %v apart, within the dwell", gap)
		}
	}
	if last := moves[len(moves)-1]; last.Prefill != 1 || last.Decode != 3 {
		t.Errorf("last split %dP+%dD, want 1P+3D for short prompts and long answers", last.Prefill, last.Decode)
	}
	if len(effects) == 0 || effects[0].BeforeMeasured != 1 || effects[0].AfterMeasured != 1 {
		t.Errorf("effects %+v, want the first move's, measured 1 before and after", effects)
	}
	if n := testutil.ToFloat64(o.moves.WithLabelValues("decode", "prefill")); n != float64(moves[0].Moved) {
		t.Errorf("pdserve_planner_role_moves_total{decode→prefill} = %v, want %d", n, moves[0].Moved)
	}
	if got, err := testutil.GatherAndCount(reg, "pdserve_planner_role_attainment"); err != nil || got < 3 {
		t.Errorf("role attainment series: %d (%v)", got, err)
	}
}

// roleOnline is an Online planner with role moves (a minute's dwell, a 2%
// gain), 3 GPUs, running 2P+1D, and its configuration.
func roleOnline(t *testing.T) (*Online, OnlineConfig) {
	t.Helper()
	cfg := onlineConfig(t)
	cfg.Roles = RoleOptions{Enabled: true, MinDwell: time.Minute, MinGain: 0.02}
	cfg.Base.GPUBudget = 3
	o, err := NewOnline(cfg, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	o.SetCurrent(2, 1)
	return o, cfg
}

// TestOnlineRefusedDemandMovesRoles: three elastic workers, 2P+1D, under
// short prompts and long answers. What the one decode worker served
// alone looks well served by 2P+1D; with the requests the pools refused
// for want of decode room (RefusedObservation) the demand is plain, and
// the planner moves a worker to decode. The measured attainment counts
// each refusal as a miss, and a refusal's max_tokens beyond the longest
// output served is capped there.
func TestOnlineRefusedDemandMovesRoles(t *testing.T) {
	const in, out = 128, 700
	const served, refused = 0.8, 1.6 // requests a second
	run := func(withRefused bool, maxTokens int) *RoleDecision {
		o, _ := roleOnline(t)
		end := t0.Add(2 * time.Minute)
		for at := t0; at.Before(end); at = at.Add(time.Duration(float64(time.Second) / served)) {
			o.Observe(mixObs(at, in, out, 100*time.Millisecond))
		}
		if withRefused {
			for at := t0; at.Before(end); at = at.Add(time.Duration(float64(time.Second) / refused)) {
				o.Observe(RefusedObservation("", at, in, maxTokens))
			}
		}
		d, ok := o.Tick(end)
		if !ok || d.Roles == nil {
			t.Fatalf("no decision (%v) or no role decision", ok)
		}
		t.Logf("refused %v (max_tokens %d): %d observations, %.1f req/s; %dP+%dD → %dP+%dD predicted %.3f → %.3f (%s), measured %.3f",
			withRefused, maxTokens, d.Observations, d.ObservedRate, d.Roles.CurrentPrefill, d.Roles.CurrentDecode, d.Roles.Prefill, d.Roles.Decode,
			d.Roles.PredictedBefore, d.Roles.PredictedAfter, d.Roles.Reason, d.Roles.Measured)
		return d.Roles
	}
	if r := run(false, 0); r.Changed {
		t.Errorf("served alone: moved to %dP+%dD, want 2P+1D kept", r.Prefill, r.Decode)
	}
	r := run(true, out)
	if !r.Changed || r.Prefill != 1 || r.Decode != 2 {
		t.Errorf("with the refused demand: %dP+%dD (%s), want a move to 1P+2D", r.Prefill, r.Decode, r.Reason)
	}
	if want := served / (served + refused); r.Measured < want-0.02 || r.Measured > want+0.02 {
		t.Errorf("measured attainment %.3f, want ≈ %.3f (each refusal a miss)", r.Measured, want)
	}
	// A max_tokens of the whole context counts as the longest output
	// served: the same decision.
	if r2 := run(true, 100_000); r2.Prefill != r.Prefill || r2.Decode != r.Decode || r2.PredictedBefore != r.PredictedBefore {
		t.Errorf("max_tokens 100000: %dP+%dD predicted %.3f; want as with max_tokens %d: %dP+%dD predicted %.3f",
			r2.Prefill, r2.Decode, r2.PredictedBefore, out, r.Prefill, r.Decode, r.PredictedBefore)
	}
}

// TestServedRetriesAreTermsOnly: a refused request whose client's retry
// was then served counts once as demand. With a served retry
// (TermsOnly) for each refusal, the observed rate and the measured
// attainment are those of the served and refused requests alone; the
// retries' measured prefill times still correct the model (here 3× the
// predicted: the prefill correction moves off 1, and with it the split).
func TestServedRetriesAreTermsOnly(t *testing.T) {
	const in, out = 128, 700
	const served, refused = 0.8, 1.6 // requests a second
	run := func(retries bool) Decision {
		o, cfg := roleOnline(t)
		end := t0.Add(2 * time.Minute)
		for at := t0; at.Before(end); at = at.Add(time.Duration(float64(time.Second) / served)) {
			o.Observe(mixObs(at, in, out, 100*time.Millisecond))
		}
		pred := cfg.Base.Prefill.StepSeconds(perfmodel.Batch{Prefill: []int{in}})
		for at := t0; at.Before(end); at = at.Add(time.Duration(float64(time.Second) / refused)) {
			o.Observe(RefusedObservation("", at, in, out))
			if retries {
				ob := mixObs(at.Add(2*time.Second), in, out, 100*time.Millisecond)
				ob.Disaggregated, ob.Prefill, ob.PrefillBatch = true, time.Duration(3*pred*float64(time.Second)), 1
				ob.TermsOnly = true
				o.Observe(ob)
			}
		}
		d, ok := o.Tick(end.Add(2 * time.Second))
		if !ok || d.Roles == nil {
			t.Fatalf("no decision (%v) or no role decision", ok)
		}
		return d
	}
	with, without := run(true), run(false)
	t.Logf("with served retries: %d observations, %.3f req/s, measured %.3f, %dP+%dD, prefill correction %.2f; without: %d, %.3f req/s, measured %.3f, %dP+%dD, %.2f",
		with.Observations, with.ObservedRate, with.Roles.Measured, with.Roles.Prefill, with.Roles.Decode, with.Scale.Prefill,
		without.Observations, without.ObservedRate, without.Roles.Measured, without.Roles.Prefill, without.Roles.Decode, without.Scale.Prefill)
	if with.Observations <= without.Observations {
		t.Errorf("observations %d with the retries, %d without: the retries are observed", with.Observations, without.Observations)
	}
	if math.Abs(with.ObservedRate-without.ObservedRate) > 0.02*without.ObservedRate {
		t.Errorf("observed rate %.3f with the served retries, %.3f without: a retry is not demand again", with.ObservedRate, without.ObservedRate)
	}
	if with.Roles.Measured != without.Roles.Measured {
		t.Errorf("measured attainment %.3f with the served retries, %.3f without: a retry is not an attainment sample", with.Roles.Measured, without.Roles.Measured)
	}
	if without.Scale.Prefill != 1 || with.Scale.Prefill < 2 {
		t.Errorf("prefill correction %.2f with the retries' 3× prefills, %.2f without: want > 2 and 1", with.Scale.Prefill, without.Scale.Prefill)
	}
}
