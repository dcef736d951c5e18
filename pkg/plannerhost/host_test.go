package plannerhost_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/plannertest"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/perfmodel"
	"github.com/pdserve/pdserve/pkg/plannerhost"
)

func TestPlannerOptions(t *testing.T) {
	policy := plannertest.SLOPolicy(t)
	standaloneSim := func(o *coordinator.Options) {
		o.Standalone, o.Engine, o.PolicyFile = true, plannertest.SimEngine(), policy
	}
	tests := []struct {
		name        string
		edit        func(*coordinator.Options, *plannerhost.Options)
		wantMode    string // effective planner mode in LogFields
		wantProfile string
		wantErr     string
	}{
		{name: "auto without a profile is off", wantMode: plannerhost.Off},
		{name: "auto uses the standalone sim profile", edit: func(o *coordinator.Options, _ *plannerhost.Options) { standaloneSim(o) }, wantMode: plannerhost.Log, wantProfile: plannertest.Profile},
		{name: "auto with a profile", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			o.PolicyFile, p.Profile = policy, "h100/llama-3-70b/tp4"
		}, wantMode: plannerhost.Log, wantProfile: "h100/llama-3-70b/tp4"},
		{name: "decode profile of the same model", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			o.PolicyFile, p.Profile, p.DecodeProfile = policy, "h100/llama-2-70b/tp2", "a100-80g/llama-2-70b/tp2"
		}, wantMode: plannerhost.Log, wantProfile: "h100/llama-2-70b/tp2"},
		{name: "auto without SLOs is off", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			standaloneSim(o)
			o.PolicyFile = ""
		}, wantMode: plannerhost.Off},
		{name: "auto in colocated mode is off", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			standaloneSim(o)
			o.Mode = coordinator.ModeColocated
		}, wantMode: plannerhost.Off},
		{name: "explicit off", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			standaloneSim(o)
			p.Mode = plannerhost.Off
		}, wantMode: plannerhost.Off},
		{name: "kubernetes with its Deployments", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			standaloneSim(o)
			p.Mode, p.Namespace, p.PrefillDeployment, p.DecodeDeployment = plannerhost.Kubernetes, "ns", "p", "d"
		}, wantMode: plannerhost.Kubernetes, wantProfile: plannertest.Profile},
		{name: "log needs a profile", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			o.PolicyFile, p.Mode = policy, plannerhost.Log
		}, wantErr: "planner-profile"},
		{name: "log needs SLOs", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			p.Mode, p.Profile = plannerhost.Log, plannertest.Profile
		}, wantErr: "slo.ttft_ms"},
		{name: "log in colocated mode", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			standaloneSim(o)
			o.Mode, p.Mode = coordinator.ModeColocated, plannerhost.Log
		}, wantErr: "colocated"},
		{name: "kubernetes needs its Deployments", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			standaloneSim(o)
			p.Mode = plannerhost.Kubernetes
		}, wantErr: "planner-prefill-deployment"},
		{name: "unknown mode", edit: func(o *coordinator.Options, p *plannerhost.Options) { p.Mode = "maybe" }, wantErr: `planner "maybe"`},
		{name: "unknown profile", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			standaloneSim(o)
			p.Profile = "tpu/none/tp1"
		}, wantErr: "planner-profile"},
		{name: "decode profile of another model", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			standaloneSim(o)
			p.DecodeProfile = "h100/llama-3-70b/tp4"
		}, wantErr: "planner-decode-profile model"},
		{name: "unknown decode profile", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			standaloneSim(o)
			p.DecodeProfile = "x"
		}, wantErr: "planner-decode-profile"},
		{name: "unknown codec", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			standaloneSim(o)
			p.Codec = "gzip"
		}, wantErr: "planner-codec"},
		{name: "missing codec profile", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			standaloneSim(o)
			p.CodecProfile = "no-such-codecs.json"
		}, wantErr: "planner-codec-profile"},
		{name: "zero interval", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			standaloneSim(o)
			p.Interval = 0
		}, wantErr: "planner-interval"},
		{name: "zero headroom", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			standaloneSim(o)
			p.Headroom = 0
		}, wantErr: "planner-headroom"},
		{name: "one observation", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			standaloneSim(o)
			p.MinObservations = 1
		}, wantErr: "planner-min-observations"},
		{name: "GPU budget below one worker per pool", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			standaloneSim(o)
			p.GPUBudget = 1
		}, wantErr: "GPU budget"},
		{name: "zero link", edit: func(o *coordinator.Options, p *plannerhost.Options) {
			standaloneSim(o)
			p.LinkGbps = 0
		}, wantErr: "link bandwidth"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, p := coordinator.DefaultOptions(), plannerhost.DefaultOptions()
			if tc.edit != nil {
				tc.edit(&o, &p)
			}
			if err := o.Complete(); err != nil {
				t.Fatal(err)
			}
			err := errors.Join(o.Validate(), p.Validate(o))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Validate error %v, want one about %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Validate: %v", err)
			}
			fields := p.LogFields(o)
			if got := plannertest.LogField(fields, "planner"); got != tc.wantMode {
				t.Errorf("planner mode %q, want %q", got, tc.wantMode)
			}
			if got := plannertest.LogField(fields, "planner_profile"); got != tc.wantProfile {
				t.Errorf("planner profile %q, want %q", got, tc.wantProfile)
			}
			if tc.wantMode == plannerhost.Off && plannertest.LogField(fields, "planner_off_reason") == "" && p.Mode == plannerhost.Auto {
				t.Errorf("auto planner off without a reason in the log fields")
			}
		})
	}
}

// The online planner starts from a profile file written by coordinator
// profile: a CPU profile's budget counts cores, by default those of the
// machine it was measured on.
func TestPlannerStartsFromAMeasuredProfileFile(t *testing.T) {
	prof := &perfmodel.Profile{
		Name: "cpu/tiny/t1", GPU: "cpu", Model: "tiny", TP: 1, Device: perfmodel.DeviceCPU, Threads: 1,
		Spec: perfmodel.ModelShape{Params: 4.2e6, Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, HeadDim: 16,
			Intermediate: 128, Vocab: 32000, MaxSeqLen: 2048, RopeTheta: 1e4},
		Form: perfmodel.FormDistServe,
		DistServe: &perfmodel.DistServe{Prefill: [3]float64{0.7, 0.006, 1.5e-5},
			DecodeSmall: [3]float64{0.25, 0.0009, 0.14}, DecodeLarge: [3]float64{0.25, 0.0009, 0.14}, LargeBatchThreshold: 1},
		Memory: perfmodel.Memory{MaxKVTokens: 2048},
		Source: "measured", Calibration: "fit", Tolerance: 0.25,
		Points: []perfmodel.Point{{Name: "prefill 1x64", Metric: perfmodel.MetricStepMs, Prefill: []int{64}, Value: 1.2, Source: "measured", Check: perfmodel.CheckFit}},
		Measured: &perfmodel.Measurement{Tool: "coordinator profile", Engine: "llamacpp", Repeats: 3,
			Hardware: perfmodel.Host{CPU: "test CPU", LogicalCPUs: 2, Threads: 1}},
	}
	prof.Measured.Fit = prof.SetFitErrors()
	file := filepath.Join(t.TempDir(), "cpu-t1.json")
	if err := prof.WriteFile(file); err != nil {
		t.Fatal(err)
	}
	o, p := coordinator.DefaultOptions(), plannerhost.DefaultOptions()
	o.PolicyFile, p.Profile = plannertest.SLOPolicy(t), file
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(o.Validate(), p.Validate(o)); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	h, err := plannerhost.New(p, o, nil)
	if err != nil || h == nil {
		t.Fatalf("New: %v, %v", h, err)
	}
	base := h.Base()
	if base.Prefill.Name != prof.Name || !base.Prefill.CPU() || base.GPUBudget != 2 {
		t.Errorf("starting point: profile %s (cpu %v), budget %d; want %s on the profile's 2 cores", base.Prefill.Name, base.Prefill.CPU(), base.GPUBudget, prof.Name)
	}
}
