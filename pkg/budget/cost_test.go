package budget

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestCost(t *testing.T) {
	gpu := &Pricing{GPUHourUSD: 3.6, PrefillGPUs: 2, DecodeGPUs: 1} // $0.001 per GPU-second
	tests := []struct {
		name   string
		trace  Trace
		want   Cost
		wantOK bool
	}{
		{
			name:  "no pricing: no cost",
			trace: Trace{PromptTokens: 10, OutputTokens: 5, PrefillStart: at(0), PrefillEnd: at(100)},
		},
		{
			// prefill 100 ms / batch 4 × 2 GPUs = 0.05 GPU-s; decode from
			// joining (150 ms; the first token came from the prefill
			// worker at 111 ms) to 1150 ms = 1 s / batch 8 × 1 GPU =
			// 0.125 GPU-s. 0.175 GPU-s × $3.6/h = $0.000175 for 1100
			// tokens: $0.000175 / 1.1 per 1k.
			name: "gpu time, disaggregated",
			trace: Trace{
				Pricing: gpu, Mode: "disaggregated", PromptTokens: 1000, OutputTokens: 100,
				PrefillStart: at(10), PrefillEnd: at(110), PrefillBatch: 4,
				FirstToken: at(111), DecodeJoined: at(150), LastToken: at(1150), BatchSize: 8,
			},
			want:   Cost{GPUSeconds: 0.175, USD: 0.000175, USDPer1kTokens: 0.000175 / 1.1},
			wantOK: true,
		},
		{
			// The decode worker prefilled: its 2 GPUs, no batch reported,
			// 0.2 s × 2 = 0.4 GPU-s; decode from the first token (after
			// joining) 1 s / batch 4 × 2 = 0.5 GPU-s. 0.9 GPU-s × $7.2/h
			// = $0.0018 for 1000 tokens.
			name: "gpu time, colocated",
			trace: Trace{
				Pricing: &Pricing{GPUHourUSD: 7.2, PrefillGPUs: 4, DecodeGPUs: 2}, Mode: "colocated",
				PromptTokens: 500, OutputTokens: 500,
				DecodeJoined: at(5), PrefillStart: at(10), PrefillEnd: at(210),
				FirstToken: at(210), LastToken: at(1210), BatchSize: 4,
			},
			want:   Cost{GPUSeconds: 0.9, USD: 0.0018, USDPer1kTokens: 0.0018},
			wantOK: true,
		},
		{
			// 0 GPUs counts as 1: 0.1 s + 0.
			name: "gpu time, unset gpus and batches count as 1",
			trace: Trace{
				Pricing: &Pricing{GPUHourUSD: 36}, Mode: "local", PromptTokens: 10, OutputTokens: 1,
				PrefillStart: at(0), PrefillEnd: at(100), FirstToken: at(100), LastToken: at(100),
			},
			want:   Cost{GPUSeconds: 0.1, USD: 0.001, USDPer1kTokens: 0.001 / 11 * 1000},
			wantOK: true,
		},
		{
			// 2000 × $0.5/1k + 400 × $1.5/1k = $1.6 for 2400 tokens.
			name: "token prices",
			trace: Trace{
				Pricing:      &Pricing{PromptUSDPer1k: 0.5, OutputUSDPer1k: 1.5},
				PromptTokens: 2000, OutputTokens: 400, PrefillStart: at(0), PrefillEnd: at(100),
			},
			want:   Cost{USD: 1.6, USDPer1kTokens: 1.6 / 2.4},
			wantOK: true,
		},
		{
			name:   "refused request costs nothing",
			trace:  Trace{Pricing: gpu, Arrival: at(0)},
			want:   Cost{},
			wantOK: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tc.trace.Cost()
			if ok != tc.wantOK {
				t.Fatalf("Cost ok = %v, want %v", ok, tc.wantOK)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateApprox(1e-12, 0)); diff != "" {
				t.Errorf("Cost (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSummaryCost(t *testing.T) {
	tr := Trace{
		Pricing: &Pricing{GPUHourUSD: 3.6, PrefillGPUs: 2, DecodeGPUs: 1}, Mode: "disaggregated",
		Arrival: at(0), PrefillStart: at(10), PrefillEnd: at(110), PrefillBatch: 4,
		FirstToken: at(111), DecodeJoined: at(150), LastToken: at(1150), BatchSize: 8,
		PromptTokens: 1000, OutputTokens: 100,
	}
	s := tr.Summary()
	got := map[string]float64{"cost_usd": *s.CostUSD, "cost_usd_per_1k_tokens": *s.CostUSDPer1kTokens, "gpu_seconds": *s.GPUSeconds}
	// Six significant digits.
	want := map[string]float64{"cost_usd": 0.000175, "cost_usd_per_1k_tokens": 0.000159091, "gpu_seconds": 0.175}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("cost fields (-want +got):\n%s", diff)
	}

	tr.Pricing = &Pricing{PromptUSDPer1k: 1}
	if s := tr.Summary(); s.GPUSeconds != nil || s.CostUSD == nil || *s.CostUSD != 1 {
		t.Errorf("token pricing: gpu_seconds %v, cost_usd %v; want none and 1", s.GPUSeconds, s.CostUSD)
	}
	tr.Pricing = nil
	if s := tr.Summary(); s.CostUSD != nil || s.CostUSDPer1kTokens != nil || s.GPUSeconds != nil {
		t.Errorf("unpriced request has cost fields: %+v", s)
	}
}

func TestWarn(t *testing.T) {
	var tr Trace
	tr.Warn("a")
	tr.Warn("b")
	tr.Warn("a")
	if diff := cmp.Diff([]string{"a", "b"}, tr.Warnings); diff != "" {
		t.Errorf("Warnings (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"a", "b"}, tr.Summary().Warnings); diff != "" {
		t.Errorf("Summary.Warnings (-want +got):\n%s", diff)
	}
}

func TestRoundSig(t *testing.T) {
	for _, tc := range []struct{ in, want float64 }{
		{0, 0}, {1, 1}, {0.000175 / 1.1, 0.000159091}, {123456789, 123457000}, {-2.0 / 3, -0.666667},
	} {
		if got := roundSig(tc.in); got != tc.want {
			t.Errorf("roundSig(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestLogCostAndWarnings(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	tr := Trace{
		RequestID: "r1", Pricing: &Pricing{PromptUSDPer1k: 2, OutputUSDPer1k: 4},
		PromptTokens: 500, OutputTokens: 250, Warnings: []string{"engine behind"},
	}
	tr.Log(zap.New(core))
	m := logs.All()[0].ContextMap()
	// 500 × $2/1k + 250 × $4/1k = $2 for 750 tokens.
	for key, want := range map[string]any{"cost_usd": 2.0, "cost_usd_per_1k_tokens": 2.66667, "warnings": []any{"engine behind"}} {
		if diff := cmp.Diff(want, m[key]); diff != "" {
			t.Errorf("field %s (-want +got):\n%s", key, diff)
		}
	}
	if _, ok := m["gpu_seconds"]; ok {
		t.Error("gpu_seconds logged under token pricing")
	}

	logs.TakeAll()
	(&Trace{RequestID: "r2"}).Log(zap.New(core))
	for _, key := range []string{"cost_usd", "cost_usd_per_1k_tokens", "gpu_seconds", "warnings"} {
		if _, ok := logs.All()[0].ContextMap()[key]; ok {
			t.Errorf("unpriced request without warnings logs %s", key)
		}
	}
}
