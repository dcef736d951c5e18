package config

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/budget"
)

func TestPricing(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		want    *budget.Pricing
		wantErr bool // wraps ErrInvalid
	}{
		{name: "none: no cost", yaml: ""},
		{name: "gpu time, gpus default to 1", yaml: "pricing: {gpu_usd_per_hour: 2.5}", want: &budget.Pricing{GPUHourUSD: 2.5, PrefillGPUs: 1, DecodeGPUs: 1}},
		{
			name: "gpu time with gpus per worker",
			yaml: "pricing: {gpu_usd_per_hour: 4, prefill_gpus_per_worker: 2, decode_gpus_per_worker: 8}",
			want: &budget.Pricing{GPUHourUSD: 4, PrefillGPUs: 2, DecodeGPUs: 8},
		},
		{name: "token prices", yaml: "pricing: {prompt_usd_per_1k_tokens: 0.5, output_usd_per_1k_tokens: 1.5}", want: &budget.Pricing{PromptUSDPer1k: 0.5, OutputUSDPer1k: 1.5}},
		{name: "output price only", yaml: "pricing: {output_usd_per_1k_tokens: 1}", want: &budget.Pricing{OutputUSDPer1k: 1}},
		{name: "both models", yaml: "pricing: {gpu_usd_per_hour: 2, prompt_usd_per_1k_tokens: 1}", wantErr: true},
		{name: "gpus without a gpu price change nothing", yaml: "pricing: {decode_gpus_per_worker: 2}", wantErr: true},
		{name: "gpus with token prices change nothing", yaml: "pricing: {prefill_gpus_per_worker: 2, output_usd_per_1k_tokens: 1}", wantErr: true},
		{name: "negative price", yaml: "pricing: {gpu_usd_per_hour: -1}", wantErr: true},
		{name: "nan price", yaml: "pricing: {prompt_usd_per_1k_tokens: .nan}", wantErr: true},
		{name: "infinite price", yaml: "pricing: {output_usd_per_1k_tokens: .inf}", wantErr: true},
		{name: "negative gpus", yaml: "pricing: {gpu_usd_per_hour: 1, prefill_gpus_per_worker: -1}", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse([]byte(tc.yaml))
			if tc.wantErr {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("Parse error = %v, want one wrapping ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tc.want, p.Pricing.Resolve()); diff != "" {
				t.Errorf("Resolve (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPricingUnknownField(t *testing.T) {
	if _, err := Parse([]byte("pricing: {usd_per_gpu_hour: 2}")); err == nil {
		t.Error("a misspelt price parsed")
	}
}
