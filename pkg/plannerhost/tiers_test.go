package plannerhost_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/planner"
	"github.com/pdserve/pdserve/pkg/plannerhost"
)

// The tier of these tests: a fast and a quality model, each with its own
// profile.
const (
	fast, quality               = "llama-3-8b", "llama-3-70b"
	fastProfile, qualityProfile = "h100/llama-3-8b/tp1", "h100/llama-3-70b/tp4"
)

// tierPolicy writes a policy with SLOs and the tier chat: [fast, quality].
func tierPolicy(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	policy := fmt.Sprintf("slo: {ttft_ms: 500, tpot_ms: 50, attainment: 0.9}\ntiers:\n  chat: {models: [%s, %s]}\n", fast, quality)
	if err := os.WriteFile(path, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// tierOptions returns completed coordinator options with tierPolicy and
// planner options with a profile per model, edited by edit.
func tierOptions(t *testing.T, edit func(*plannerhost.Options)) (coordinator.Options, plannerhost.Options) {
	t.Helper()
	o, p := coordinator.DefaultOptions(), plannerhost.DefaultOptions()
	o.PolicyFile = tierPolicy(t)
	p.ModelProfiles = map[string]string{fast: fastProfile, quality: qualityProfile}
	if edit != nil {
		edit(&p)
	}
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	return o, p
}

// TestTierPlannerOptions: with tiers, each model of the tiers needs a
// profile (its own or --planner-profile), a model profile must name a
// model of the tiers, and the Kubernetes actuator (one pair of
// Deployments) is refused.
func TestTierPlannerOptions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		edit    func(*plannerhost.Options)
		wantErr string
	}{
		{name: "a profile per model"},
		{name: "one model by --planner-profile", edit: func(p *plannerhost.Options) {
			delete(p.ModelProfiles, quality)
			p.Profile = qualityProfile
		}},
		{name: "a model without a profile", edit: func(p *plannerhost.Options) {
			p.Mode = plannerhost.Log
			delete(p.ModelProfiles, quality)
		}, wantErr: "model " + quality + " of the policy's tiers has no profile"},
		{name: "a profile of a model of no tier", edit: func(p *plannerhost.Options) {
			p.ModelProfiles["mistral-7b"] = fastProfile
		}, wantErr: "no tier of the policy serves model mistral-7b"},
		{name: "an unknown profile", edit: func(p *plannerhost.Options) {
			p.ModelProfiles[quality] = "h100/no-such-model/tp1"
		}, wantErr: "planner-model-profile " + quality},
		{name: "kubernetes", edit: func(p *plannerhost.Options) {
			p.Mode, p.Namespace, p.PrefillDeployment, p.DecodeDeployment = plannerhost.Kubernetes, "ns", "p", "d"
		}, wantErr: "use --planner=log"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, p := tierOptions(t, tc.edit)
			err := p.Validate(o)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				if mode, why := p.Effective(o); mode != plannerhost.Log {
					t.Errorf("effective mode %s (%s), want log", mode, why)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Validate = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
	// The flag: MODEL=PROFILE, repeatable, once per model.
	for _, tc := range []struct {
		args    []string
		want    map[string]string
		wantErr string
	}{
		{args: []string{"--planner-model-profile=" + fast + "=" + fastProfile, "--planner-model-profile", quality + "=" + qualityProfile},
			want: map[string]string{fast: fastProfile, quality: qualityProfile}},
		{args: []string{"--planner-model-profile=" + fast}, wantErr: "want MODEL=PROFILE"},
		{args: []string{"--planner-model-profile=" + fast + "=a", "--planner-model-profile=" + fast + "=b"}, wantErr: "given twice"},
	} {
		p := plannerhost.DefaultOptions()
		fs := newFlagSet(&p)
		err := fs.Parse(tc.args)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: %v, want an error containing %q", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil || fmt.Sprint(p.ModelProfiles) != fmt.Sprint(tc.want) {
			t.Errorf("%q: %v, %v; want %v", tc.args, p.ModelProfiles, err, tc.want)
		}
	}
}

// trace is a finished disaggregated request of model arriving at.
func trace(model string, at time.Time) *budget.Trace {
	return &budget.Trace{
		Model: model, Mode: "disaggregated", FirstTokenPolicy: "prefill",
		Arrival: at, PrefillStart: at.Add(10 * time.Millisecond), PrefillEnd: at.Add(60 * time.Millisecond),
		KVFirstByte: at.Add(15 * time.Millisecond), KVDone: at.Add(65 * time.Millisecond),
		FirstToken: at.Add(61 * time.Millisecond), LastToken: at.Add(61*time.Millisecond + 99*20*time.Millisecond),
		PromptTokens: 512, OutputTokens: 100, PrefillBatch: 1, BatchSize: 8,
	}
}

// TestTierPlannerPlansEachModel: with tiers, each model of the tiers is
// planned from its own requests and its own workers: a tick publishes one
// decision per model, naming it, with the observations and rate of that
// model's requests only (a model of no tier feeds none) and its own live
// replicas, which the gauges carry with the label model.
func TestTierPlannerPlansEachModel(t *testing.T) {
	o, p := tierOptions(t, func(p *plannerhost.Options) { p.MinObservations = 2 })
	ticks := make(chan time.Time)
	p.Ticks = ticks
	if err := p.Validate(o); err != nil {
		t.Fatal(err)
	}
	h, err := plannerhost.New(p, o, nil)
	if err != nil || h == nil {
		t.Fatalf("New: %v, %v", h, err)
	}
	if got := strings.Join(h.Models(), ","); got != quality+","+fast {
		t.Errorf("models planned %s", got)
	}
	for model, prof := range map[string]string{fast: fastProfile, quality: qualityProfile} {
		if b, ok := h.BaseFor(model); !ok || b.Prefill.Name != prof {
			t.Errorf("%s: planned with profile %v (%v), want %s", model, b.Prefill, ok, prof)
		}
	}

	now := time.Now()
	members := control.NewMembership(time.Hour)
	workers := map[string][2]int{fast: {2, 3}, quality: {1, 2}, "mistral-7b": {4, 4}} // prefill, decode
	for model, n := range workers {
		for i := range n[0] + n[1] {
			role := control.RolePrefill
			if i >= n[0] {
				role = control.RoleDecode
			}
			hb := control.Heartbeat{ID: fmt.Sprintf("%s-%d", model, i), Role: string(role), GRPCAddr: fmt.Sprintf("10.0.0.%d:9000", i+1), Model: model}
			if err := members.Observe(hb, now); err != nil {
				t.Fatal(err)
			}
		}
	}
	published, reg := attachPlanner(t, h, members)
	if h.Online() != nil || h.OnlineFor(fast) == nil || h.OnlineFor(quality) == nil || h.OnlineFor("mistral-7b") != nil {
		t.Fatal("want a planner per model of the tier and none else")
	}

	// 60 s of traffic: the fast model 4 requests/s, the quality one 1/s,
	// a model of no tier 10/s.
	start := now.Add(-time.Minute)
	rates := map[string]int{fast: 4, quality: 1, "mistral-7b": 10}
	for s := range 60 {
		for model, r := range rates {
			for i := range r {
				h.ObserveTrace(trace(model, start.Add(time.Duration(s)*time.Second+time.Duration(i)*time.Second/time.Duration(r))))
			}
		}
	}

	got := tickOnce(t, h, ticks, published, now, 2)
	for model, d := range got {
		if _, ok := rates[model]; !ok || model == "mistral-7b" {
			t.Errorf("a decision for model %q", model)
			continue
		}
		if want := 60 * rates[model]; d.Observations != want {
			t.Errorf("%s: %d observations, want its own %d", model, d.Observations, want)
		}
		if d.ObservedRate < 0.9*float64(rates[model]) || d.ObservedRate > 1.1*float64(rates[model]) {
			t.Errorf("%s: observed rate %.2f/s, want ≈ %d/s", model, d.ObservedRate, rates[model])
		}
		w := workers[model]
		if d.CurrentPrefill != w[0] || d.CurrentDecode != w[1] {
			t.Errorf("%s: current %d prefill, %d decode; want its workers %d, %d", model, d.CurrentPrefill, d.CurrentDecode, w[0], w[1])
		}
		for i, role := range []string{"prefill", "decode"} {
			g, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			if v := gaugeValue(g, "pdserve_pool_replicas", map[string]string{"model": model, "role": role, "kind": "current"}); v != float64(w[i]) {
				t.Errorf("%s: pdserve_pool_replicas{role=%s,kind=current} = %v, want %d", model, role, v, w[i])
			}
		}
	}
}

// gaugeValue returns the value of the gauge name with exactly labels in
// families, or -1 when there is none.
func gaugeValue(families []*dto.MetricFamily, name string, labels map[string]string) float64 {
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue metrics
				}
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// newFlagSet returns a flag set with p's flags.
func newFlagSet(p *plannerhost.Options) *flag.FlagSet {
	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	p.AddFlags(fs)
	return fs
}

// attachPlanner attaches h with members and a registry; the decisions
// it publishes come on the channel returned.
func attachPlanner(t *testing.T, h *plannerhost.Host, members *control.Membership) (<-chan planner.Decision, *prometheus.Registry) {
	t.Helper()
	published := make(chan planner.Decision, 8)
	reg := prometheus.NewRegistry()
	err := h.Attach(coordinator.Host{
		Publish: func(subject string, data []byte) error {
			var d planner.Decision
			if subject != control.PlanSubject {
				return fmt.Errorf("subject %s", subject)
			}
			if err := json.Unmarshal(data, &d); err != nil {
				return err
			}
			published <- d
			return nil
		},
		Members: members, Registerer: reg, Log: zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return published, reg
}

// tickOnce runs h for one tick at now and returns the decisions of the
// n models it publishes, by model.
func tickOnce(t *testing.T, h *plannerhost.Host, ticks chan<- time.Time, published <-chan planner.Decision, now time.Time, n int) map[string]planner.Decision {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	ticks <- now

	got := map[string]planner.Decision{}
	for len(got) < n {
		select {
		case d := <-published:
			got[d.Model] = d
		case <-time.After(60 * time.Second):
			t.Fatalf("decisions of %d models published, want %d", len(got), n)
		}
	}
	return got
}

// twoModelHost is a planner host of the tiers' two models (tierOptions,
// MinObservations 2) with a prefill and a decode worker of each, seen at
// now, ticked by the returned channel, publishing on the other.
func twoModelHost(t *testing.T, now time.Time) (*plannerhost.Host, chan time.Time, <-chan planner.Decision) {
	t.Helper()
	o, p := tierOptions(t, func(p *plannerhost.Options) { p.MinObservations = 2 })
	ticks := make(chan time.Time)
	p.Ticks = ticks
	h, err := plannerhost.New(p, o, nil)
	if err != nil || h == nil {
		t.Fatalf("New: %v, %v", h, err)
	}
	members := control.NewMembership(time.Hour)
	for i, hb := range []control.Heartbeat{
		{Role: string(control.RolePrefill), Model: fast}, {Role: string(control.RoleDecode), Model: fast},
		{Role: string(control.RolePrefill), Model: quality}, {Role: string(control.RoleDecode), Model: quality},
	} {
		hb.ID, hb.GRPCAddr = fmt.Sprintf("w%d", i), fmt.Sprintf("10.0.0.%d:9000", i+1)
		if err := members.Observe(hb, now); err != nil {
			t.Fatal(err)
		}
	}
	published, _ := attachPlanner(t, h, members)
	return h, ticks, published
}

// TestTierPlannerCountsFallbacksAsDemand: a request the tier's fast model
// was passed over for (budget.Objective.TierPassed), served by the
// quality model, is demand of the fast model too: the fast model's
// planner plans for its own requests and those, and asks for more
// replicas than it would for what it served alone; its corrections
// (from measured terms) stay those of what it served. The quality
// model's planner sees what it served either way.
func TestTierPlannerCountsFallbacksAsDemand(t *testing.T) {
	const served, passed = 2, 40 // requests a second: the fast model's own, its fallbacks
	now := time.Now()
	start := now.Add(-time.Minute)
	run := func(demand bool) map[string]planner.Decision {
		h, ticks, published := twoModelHost(t, now)
		for s := range 60 {
			at := start.Add(time.Duration(s) * time.Second)
			for i := range served {
				h.ObserveTrace(trace(fast, at.Add(time.Duration(i)*time.Second/served)))
			}
			for i := range passed {
				tr := trace(quality, at.Add(time.Duration(i)*time.Second/passed))
				// The quality model's terms: a slower prefill and decode.
				tr.PrefillEnd = tr.PrefillEnd.Add(200 * time.Millisecond)
				tr.LastToken = tr.LastToken.Add(99 * 30 * time.Millisecond)
				tr.Objective = budget.Objective{Tier: "chat", TierFallback: "over_budget"}
				if demand {
					tr.Objective.TierPassed = []string{fast}
				}
				h.ObserveTrace(tr)
			}
		}
		return tickOnce(t, h, ticks, published, now, 2)
	}
	with, without := run(true), run(false)
	f, f0 := with[fast], without[fast]
	if f.Observations != 60*(served+passed) || f0.Observations != 60*served {
		t.Errorf("fast model's observations: %d with its fallbacks (want %d), %d without (want %d)",
			f.Observations, 60*(served+passed), f0.Observations, 60*served)
	}
	if f.ObservedRate < 0.9*(served+passed) {
		t.Errorf("fast model's observed rate %.1f/s, want ≈ %d/s (served and passed over)", f.ObservedRate, served+passed)
	}
	if f.TargetPrefill+f.TargetDecode <= f0.TargetPrefill+f0.TargetDecode {
		t.Errorf("fast model's target with its fallbacks' demand %d+%d, without %d+%d: want more replicas",
			f.TargetPrefill, f.TargetDecode, f0.TargetPrefill, f0.TargetDecode)
	}
	if f.Scale != f0.Scale {
		t.Errorf("fast model's corrections %+v with demand, %+v without: demand has no measured term", f.Scale, f0.Scale)
	}
	if q, q0 := with[quality], without[quality]; q.Observations != 60*passed || q0.Observations != 60*passed {
		t.Errorf("quality model's observations %d and %d, want what it served, %d", q.Observations, q0.Observations, 60*passed)
	}
}

// TestServedRetryIsNotDemandAgain: a request served on its client's retry
// of a refusal (ObserveServedRetry, after ObserveRefused) is observed for
// its terms only: with such a retry for each refusal, the model's planner
// sees more observations but the same rate, that of the served and
// refused requests.
func TestServedRetryIsNotDemandAgain(t *testing.T) {
	const served, refused = 2, 2 // requests a second
	now := time.Now()
	start := now.Add(-time.Minute)
	run := func(retries bool) planner.Decision {
		h, ticks, published := twoModelHost(t, now)
		for s := range 58 {
			at := start.Add(time.Duration(s) * time.Second)
			for i := range served {
				h.ObserveTrace(trace(fast, at.Add(time.Duration(i)*time.Second/served)))
			}
			for i := range refused {
				at := at.Add(time.Duration(i)*time.Second/refused + time.Second/(2*refused))
				h.ObserveRefused(trace(fast, at), 100)
				if retries {
					h.ObserveServedRetry(trace(fast, at.Add(time.Second)))
				}
			}
			h.ObserveTrace(trace(quality, at))
		}
		return tickOnce(t, h, ticks, published, now, 2)[fast]
	}
	with, without := run(true), run(false)
	if want := 58 * (served + 2*refused); with.Observations != want {
		t.Errorf("observations with the served retries %d, want %d", with.Observations, want)
	}
	if math.Abs(with.ObservedRate-without.ObservedRate) > 0.01*without.ObservedRate {
		t.Errorf("observed rate %.3f/s with the served retries, %.3f/s without: a served retry is not demand again", with.ObservedRate, without.ObservedRate)
	}
}
