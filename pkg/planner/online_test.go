package planner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/perfmodel"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func onlineConfig(t *testing.T) OnlineConfig {
	cfg := opt13(t)
	cfg.LinkBytesPerSec = 400e9 / 8
	cfg.Workload = nil
	return OnlineConfig{
		Base:     *cfg,
		Window:   2 * time.Minute,
		Interval: 30 * time.Second,
		Cooldown: 5 * time.Minute,
	}
}

// traffic feeds an Online with Poisson arrivals of 512/64 requests whose
// measured times are the model's times scaled by scale (1 = exact).
type traffic struct {
	p     *perfmodel.Profile
	rng   *rand.Rand
	next  time.Time
	scale Scale
	link  float64 // bytes/s
}

func newTraffic(p *perfmodel.Profile) *traffic {
	return &traffic{p: p, rng: rand.New(rand.NewPCG(1, 2)), next: t0, scale: Scale{Prefill: 1, Decode: 1, Transfer: 1}, link: 400e9 / 8}
}

func (tr *traffic) observation(arrival time.Time) Observation {
	pre := tr.p.StepTime(perfmodel.Batch{Prefill: []int{512}})
	dec := make([]int, 8)
	for i := range dec {
		dec[i] = 512 + 32
	}
	step := tr.p.StepSeconds(perfmodel.Batch{Decode: dec})
	raw := int64(512) * tr.p.KVBytesPerToken()
	prefill := pre.Seconds() * tr.scale.Prefill
	link := float64(raw) / tr.link * tr.scale.Transfer
	return Observation{
		Arrival: arrival, PromptTokens: 512, OutputTokens: 64, Disaggregated: true,
		Prefill: time.Duration(prefill * 1e9), PrefillBatch: 1,
		TPOT: time.Duration(step * tr.scale.Decode * 1e9), DecodeBatch: 8,
		KVStream: time.Duration(max(link, prefill*(1-1.0/40)+link/40) * 1e9), KVBytesRaw: raw,
		FirstTokenPolicy: "decode",
	}
}

// until observes every request arriving before end at rate.
func (tr *traffic) until(o *Online, end time.Time, rate float64) {
	for tr.next.Before(end) {
		o.Observe(tr.observation(tr.next))
		tr.next = tr.next.Add(time.Duration(tr.rng.ExpFloat64() / rate * 1e9))
	}
}

// A scripted step in the arrival rate changes the desired replicas once,
// after the cooldown, and a step back down changes them once more; the
// Poisson noise of the observed rate never makes them go back and forth.
func TestOnlineRateShift(t *testing.T) {
	cfg := onlineConfig(t)
	o, err := NewOnline(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := newTraffic(cfg.Base.Prefill)
	phases := []struct {
		until time.Duration
		rate  float64
	}{{2 * time.Minute, 3}, {14 * time.Minute, 20}, {30 * time.Minute, 3}}
	var changes []Decision
	var log []string
	now := t0
	for _, ph := range phases {
		for ; now.Before(t0.Add(ph.until)); now = now.Add(10 * time.Second) { // tick more often than Interval
			tr.until(o, now.Add(-time.Second), ph.rate) // requests finish about a second after arriving
			d, ok := o.Tick(now)
			if !ok {
				continue
			}
			log = append(log, fmt.Sprintf("%5v %4.1f req/s → target %dP+%dD, desired %dP+%dD (%s)", now.Sub(t0),
				d.ObservedRate, d.TargetPrefill, d.TargetDecode, d.PrefillReplicas, d.DecodeReplicas, d.Reason))
			if d.Changed {
				changes = append(changes, d)
			}
		}
	}
	t.Logf("decisions:\n%s", strings.Join(log, "\n"))
	if len(changes) != 3 {
		t.Fatalf("%d changes of the desired replicas, want 3 (initial, up, down)", len(changes))
	}
	initial, up, down := changes[0], changes[1], changes[2]
	if initial.Reason != ReasonInitial || up.Reason != ReasonScaleUp || down.Reason != ReasonScaleDown {
		t.Errorf("reasons %q, %q, %q; want %q, %q, %q", initial.Reason, up.Reason, down.Reason, ReasonInitial, ReasonScaleUp, ReasonScaleDown)
	}
	gpus := func(d Decision) int { return d.PrefillReplicas + d.DecodeReplicas }
	if !(gpus(up) > gpus(initial) && gpus(down) < gpus(up)) {
		t.Errorf("replicas %d → %d → %d GPUs, want up then down", gpus(initial), gpus(up), gpus(down))
	}
	if up.Time.Sub(initial.Time) < cfg.Cooldown || down.Time.Sub(up.Time) < cfg.Cooldown {
		t.Errorf("changes at %v, %v, %v: closer than the %v cooldown", initial.Time.Sub(t0), up.Time.Sub(t0), down.Time.Sub(t0), cfg.Cooldown)
	}
	if up.Time.Before(t0.Add(2*time.Minute)) || down.Time.Before(t0.Add(14*time.Minute)) {
		t.Errorf("changes at %v and %v precede the rate steps", up.Time.Sub(t0), down.Time.Sub(t0))
	}
	if p, d := o.Desired(); p != down.PrefillReplicas || d != down.DecodeReplicas {
		t.Errorf("Desired = %d, %d; want the last decision's %d, %d", p, d, down.PrefillReplicas, down.DecodeReplicas)
	}
}

// Re-plans happen every Interval once the window holds enough requests;
// observations older than the window are forgotten.
func TestOnlineTickSchedule(t *testing.T) {
	cfg := onlineConfig(t)
	o, err := NewOnline(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := newTraffic(cfg.Base.Prefill)
	tr.until(o, t0.Add(10*time.Second), 3) // ~30 requests < 50
	if _, ok := o.Tick(t0.Add(10 * time.Second)); ok {
		t.Error("re-planned with fewer than MinObservations")
	}
	tr.until(o, t0.Add(40*time.Second), 3)
	d, ok := o.Tick(t0.Add(40 * time.Second))
	if !ok || !d.Changed || d.Reason != ReasonInitial {
		t.Fatalf("first re-plan: %v %+v", ok, d)
	}
	if _, ok := o.Tick(t0.Add(60 * time.Second)); ok {
		t.Error("re-planned before Interval passed")
	}
	d, ok = o.Tick(t0.Add(70 * time.Second))
	if !ok || d.Changed || d.Reason != ReasonUnchanged {
		t.Errorf("second re-plan: %v %+v", ok, d)
	}
	// Ten minutes of silence: the window is empty, no re-plan.
	if _, ok := o.Tick(t0.Add(10 * time.Minute)); ok {
		t.Error("re-planned on an empty window")
	}
}

// The model is corrected by the observed/predicted ratio of each term; the
// link's speed only where the stream is not hidden behind the prefill.
func TestOnlineCorrections(t *testing.T) {
	for _, tt := range []struct {
		name  string
		gbps  float64
		scale Scale
		want  Scale
	}{
		{"exact", 25, Scale{1, 1, 1}, Scale{1, 1, 1}},
		{"slower everywhere", 25, Scale{1.5, 2, 1.25}, Scale{1.5, 2, 1.25}},
		{"link hidden behind prefill", 400, Scale{1.5, 2, 1.25}, Scale{1.5, 2, 1}},
		{"clamped", 25, Scale{10, 0.1, 1}, Scale{4, 0.25, 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := onlineConfig(t)
			cfg.Base.LinkBytesPerSec = tt.gbps * 1e9 / 8
			o, err := NewOnline(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			tr := newTraffic(cfg.Base.Prefill)
			tr.scale, tr.link = tt.scale, cfg.Base.LinkBytesPerSec
			tr.until(o, t0.Add(time.Minute), 3)
			d, ok := o.Tick(t0.Add(time.Minute))
			if !ok {
				t.Fatal("no re-plan")
			}
			got := d.Scale
			if relErr(got.Prefill, tt.want.Prefill) > 1e-6 || relErr(got.Decode, tt.want.Decode) > 1e-6 || relErr(got.Transfer, tt.want.Transfer) > 1e-6 {
				t.Errorf("corrections %+v, want %+v", got, tt.want)
			}
		})
	}
}

// A system slower than modelled gets a larger target.
func TestOnlineCorrectionRaisesTarget(t *testing.T) {
	targets := map[float64]int{}
	for _, slow := range []float64{1, 2} {
		cfg := onlineConfig(t)
		o, _ := NewOnline(cfg, nil)
		tr := newTraffic(cfg.Base.Prefill)
		tr.scale = Scale{slow, slow, 1}
		tr.until(o, t0.Add(time.Minute), 10)
		d, ok := o.Tick(t0.Add(time.Minute))
		if !ok {
			t.Fatal("no re-plan")
		}
		targets[slow] = d.TargetPrefill + d.TargetDecode
	}
	if targets[2] <= targets[1] {
		t.Errorf("target replicas %d at twice the modelled times, %d as modelled: want more", targets[2], targets[1])
	}
}

// The first decision keeps the current replicas when they already meet
// the SLO.
func TestOnlineKeepsAdequateCurrent(t *testing.T) {
	cfg := onlineConfig(t)
	o, _ := NewOnline(cfg, nil)
	tr := newTraffic(cfg.Base.Prefill)
	tr.until(o, t0.Add(time.Minute), 3)
	o.SetCurrent(2, 2)
	d, ok := o.Tick(t0.Add(time.Minute))
	if !ok {
		t.Fatal("no re-plan")
	}
	if d.Changed || d.PrefillReplicas != 2 || d.DecodeReplicas != 2 || d.Reason != ReasonHysteresis && d.Reason != ReasonStabilize {
		t.Errorf("decision %+v: want 2P+2D kept (hysteresis or stabilization)", d)
	}
}

func TestOnlineMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	cfg := onlineConfig(t)
	o, err := NewOnline(cfg, reg)
	if err != nil {
		t.Fatal(err)
	}
	o.SetCurrent(3, 2)
	tr := newTraffic(cfg.Base.Prefill)
	tr.until(o, t0.Add(time.Minute), 3)
	o.SetCurrent(0, 0) // nothing running yet: the first decision is the plan
	d, ok := o.Tick(t0.Add(time.Minute))
	if !ok {
		t.Fatal("no re-plan")
	}
	want := fmt.Sprintf(`# HELP pdserve_pool_replicas Replicas of a worker pool: desired by the planner or current (live workers).
# TYPE pdserve_pool_replicas gauge
pdserve_pool_replicas{kind="current",role="decode"} 0
pdserve_pool_replicas{kind="current",role="prefill"} 0
pdserve_pool_replicas{kind="desired",role="decode"} %d
pdserve_pool_replicas{kind="desired",role="prefill"} %d
`, d.DecodeReplicas, d.PrefillReplicas)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pdserve_pool_replicas"); err != nil {
		t.Error(err)
	}
	if got := testutil.ToFloat64(o.rate); relErr(got, d.ObservedRate) > 1e-12 || got < 2 || got > 4 {
		t.Errorf("observed rate gauge %v, decision %v, want ≈3", got, d.ObservedRate)
	}
	if _, err := NewOnline(cfg, reg); err == nil {
		t.Error("registering the gauges twice succeeded")
	}
}

func TestNewOnlineErrors(t *testing.T) {
	for name, change := range map[string]func(*OnlineConfig){
		"no profile":    func(c *OnlineConfig) { c.Base.Prefill = nil },
		"negative wait": func(c *OnlineConfig) { c.Cooldown = -time.Second },
		"one sample":    func(c *OnlineConfig) { c.MinObservations = 1 },
		"bad SLO":       func(c *OnlineConfig) { c.Base.SLO.TPOT = 0 },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := onlineConfig(t)
			change(&cfg)
			if _, err := NewOnline(cfg, nil); !errors.Is(err, ErrConfig) {
				t.Errorf("NewOnline = %v, want ErrConfig", err)
			}
		})
	}
}

func TestObservationFromTrace(t *testing.T) {
	tr := &budget.Trace{
		Model: "llama-3-8b", Mode: "disaggregated", FirstTokenPolicy: "prefill",
		Arrival: t0, PrefillStart: t0.Add(10 * time.Millisecond), PrefillEnd: t0.Add(80 * time.Millisecond),
		KVFirstByte: t0.Add(15 * time.Millisecond), KVDone: t0.Add(90 * time.Millisecond),
		FirstToken: t0.Add(81 * time.Millisecond), LastToken: t0.Add(81*time.Millisecond + 9*20*time.Millisecond),
		PromptTokens: 512, OutputTokens: 10, PrefillBatch: 2, BatchSize: 7, KVBytesRaw: 1 << 20,
	}
	want := Observation{
		Model: "llama-3-8b", Arrival: t0, PromptTokens: 512, OutputTokens: 10, Disaggregated: true,
		Prefill: 70 * time.Millisecond, PrefillBatch: 2, TPOT: 20 * time.Millisecond, DecodeBatch: 7,
		KVStream: 75 * time.Millisecond, KVTransfer: 10 * time.Millisecond, KVBytesRaw: 1 << 20, FirstTokenPolicy: "prefill",
		TTFT: 81 * time.Millisecond,
	}
	if diff := cmp.Diff(want, ObservationFromTrace(tr)); diff != "" {
		t.Errorf("ObservationFromTrace (-want +got):\n%s", diff)
	}
}

// fakeActuator records Scale calls.
type fakeActuator struct {
	mu    sync.Mutex
	calls [][2]int
	err   error
}

func (f *fakeActuator) Scale(_ context.Context, p, d int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, [2]int{p, d})
	return f.err
}

func (f *fakeActuator) got() [][2]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][2]int(nil), f.calls...)
}

// Run publishes every decision on pdserve.plan through a real (embedded)
// NATS server and scales through the actuator when the desired replicas
// change; it stops when its context ends.
func TestOnlineRunPublishes(t *testing.T) {
	srv, url, err := control.StartEmbedded("127.0.0.1:-1")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	msgs := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe(control.PlanSubject, msgs)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	cfg := onlineConfig(t)
	act := &fakeActuator{}
	cfg.Publish, cfg.Actuator, cfg.Model = nc.Publish, act, "llama-3-8b"
	cfg.Current = func() (int, int) { return 0, 0 }
	o, err := NewOnline(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := newTraffic(cfg.Base.Prefill)
	tr.until(o, t0.Add(time.Minute), 3)

	ctx, cancel := context.WithCancel(t.Context())
	ticks := make(chan time.Time)
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx, ticks) }()
	ticks <- t0.Add(time.Minute)
	ticks <- t0.Add(100 * time.Second) // unchanged: published, not actuated

	var got []Decision
	for len(got) < 2 {
		select {
		case m := <-msgs:
			var d Decision
			if err := json.Unmarshal(m.Data, &d); err != nil {
				t.Fatalf("payload %q: %v", m.Data, err)
			}
			got = append(got, d)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d decisions published, want 2", len(got))
		}
	}
	if !got[0].Changed || got[1].Changed {
		t.Errorf("published changed = %v, %v; want true, false", got[0].Changed, got[1].Changed)
	}
	if got[0].Model != cfg.Model || got[1].Model != cfg.Model {
		t.Errorf("published models %q, %q; want the Online's %q", got[0].Model, got[1].Model, cfg.Model)
	}
	want := [][2]int{{got[0].PrefillReplicas, got[0].DecodeReplicas}}
	poll.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if diff := cmp.Diff(want, act.got()); diff != "" {
			return fmt.Errorf("actuator calls (-want +got):\n%s", diff)
		}
		return nil
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil after cancel", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// The online planner's decisions carry the warning a plan gives when the
// observed workload leaves the profile's measured range.
func TestOnlineRangeWarning(t *testing.T) {
	for _, narrow := range []bool{false, true} {
		cfg := onlineConfig(t)
		if narrow {
			cfg.Base.Prefill = measuredUpTo(t, cfg.Base.Prefill, 128, 64, 2048)
		}
		o, err := NewOnline(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		tr := newTraffic(cfg.Base.Prefill)
		tr.until(o, t0.Add(time.Minute), 3)
		d, ok := o.Tick(t0.Add(time.Minute))
		if !ok {
			t.Fatal("no decision")
		}
		switch {
		case narrow && (len(d.Warnings) != 1 || !strings.Contains(d.Warnings[0], "prompts up to 512 tokens (measured ≤ 128)")):
			t.Errorf("profile measured to 128-token prompts: warnings %q", d.Warnings)
		case !narrow && len(d.Warnings) != 0:
			t.Errorf("profile covering the workload: warnings %q", d.Warnings)
		}
	}
}
