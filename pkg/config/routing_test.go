package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/router"
)

func TestParseRouting(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	tests := []struct {
		name        string
		yaml        string
		want        Routing
		wantDecode  ScorerWeights
		wantPrefill ScorerWeights
		wantAware   bool
		// wantAwareColocated: with no prefill pool only a decode
		// prefix weight reads prefix caches.
		wantAwareColocated bool
		wantErr            error // ErrInvalid, errAny (a YAML error) or nil
	}{
		{
			// The default is prefix-aware in both profiles, so prompts
			// carry their block hashes in both modes.
			name:        "defaults",
			yaml:        "",
			wantDecode:  ScorerWeights{Prefix: DefaultDecodeWeights.Prefix, KV: 1, Batch: 0.01},
			wantPrefill: ScorerWeights{Prefix: DefaultPrefillWeights.Prefix, Queue: 1},
			wantAware:   true, wantAwareColocated: true,
		},
		{
			name:        "the prefill prefix weight",
			yaml:        "routing: {weights: {prefill: {prefix: 0.5}}}",
			want:        Routing{Weights: RoutingWeights{Prefill: PrefillWeights{Prefix: f(0.5)}}},
			wantDecode:  DefaultDecodeWeights,
			wantPrefill: ScorerWeights{Prefix: 0.5, Queue: 1},
			wantAware:   true, wantAwareColocated: true,
		},
		{
			// A prefix weight of 0 is set, not unset: prefill workers by
			// queue alone; the decode profile keeps its prefix weight.
			name:        "prefill prefix weight 0 turns prefill prefix scoring off",
			yaml:        "routing: {weights: {prefill: {prefix: 0}}}",
			want:        Routing{Weights: RoutingWeights{Prefill: PrefillWeights{Prefix: f(0)}}},
			wantDecode:  DefaultDecodeWeights,
			wantPrefill: ScorerWeights{Queue: 1},
			wantAware:   true, wantAwareColocated: true,
		},
		{
			name: "least-loaded",
			yaml: LeastLoadedYAML,
			want: Routing{Weights: RoutingWeights{
				Decode: DecodeWeights{Prefix: f(0)}, Prefill: PrefillWeights{Prefix: f(0)},
			}},
			wantDecode:  ScorerWeights(router.LeastLoadedDecodeWeights),
			wantPrefill: ScorerWeights(router.LeastLoadedPrefillWeights),
		},
		{
			name: "weights per profile, unset ones default",
			yaml: "routing: {weights: {decode: {prefix: 2, batch: 0.5}, prefill: {prefix: 1, queue: 0, batch: 3}}}",
			want: Routing{Weights: RoutingWeights{
				Decode:  DecodeWeights{Prefix: f(2), Batch: f(0.5)},
				Prefill: PrefillWeights{Prefix: f(1), Queue: f(0), Batch: f(3)},
			}},
			wantDecode:  ScorerWeights{Prefix: 2, KV: 1, Batch: 0.5},
			wantPrefill: ScorerWeights{Prefix: 1, Batch: 3},
			wantAware:   true, wantAwareColocated: true,
		},
		{
			name:        "busy rule",
			yaml:        "routing: {local_prefill_below_tokens: 64, prefill_queue_local_tokens: 8192, busy_local_prefill_below_tokens: 512}",
			want:        Routing{LocalPrefillBelowTokens: 64, PrefillQueueLocalTokens: 8192, BusyLocalPrefillBelowTokens: 512},
			wantDecode:  DefaultDecodeWeights,
			wantPrefill: DefaultPrefillWeights,
			wantAware:   true, wantAwareColocated: true,
		},
		{
			name:        "least-loaded with conditional disaggregation",
			yaml:        "routing: {local_prefill_below_tokens: 64, weights: {decode: {prefix: 0}, prefill: {prefix: 0}}}",
			want:        Routing{LocalPrefillBelowTokens: 64, Weights: RoutingWeights{Decode: DecodeWeights{Prefix: f(0)}, Prefill: PrefillWeights{Prefix: f(0)}}},
			wantDecode:  ScorerWeights(router.LeastLoadedDecodeWeights),
			wantPrefill: ScorerWeights(router.LeastLoadedPrefillWeights),
			wantAware:   true,
		},
		{
			name:        "picker maxscore",
			yaml:        "routing: {picker: maxscore}",
			want:        Routing{Picker: PickerMaxScore},
			wantDecode:  DefaultDecodeWeights,
			wantPrefill: DefaultPrefillWeights,
			wantAware:   true, wantAwareColocated: true,
		},
		{
			name:        "picker roundrobin reads no prefix cache for weights",
			yaml:        "routing: {picker: roundrobin}",
			want:        Routing{Picker: PickerRoundRobin},
			wantDecode:  DefaultDecodeWeights,
			wantPrefill: DefaultPrefillWeights,
		},
		{
			name:        "picker roundrobin with conditional disaggregation",
			yaml:        "routing: {picker: roundrobin, local_prefill_below_tokens: 64}",
			want:        Routing{Picker: PickerRoundRobin, LocalPrefillBelowTokens: 64},
			wantDecode:  DefaultDecodeWeights,
			wantPrefill: DefaultPrefillWeights,
			wantAware:   true,
		},
		{name: "unknown picker", yaml: "routing: {picker: random}", wantErr: ErrInvalid},
		{name: "roundrobin with weights", yaml: "routing: {picker: roundrobin, weights: {decode: {prefix: 1}}}", wantErr: ErrInvalid},
		{name: "roundrobin with a weight 0", yaml: "routing: {picker: roundrobin, weights: {prefill: {prefix: 0}}}", wantErr: ErrInvalid},
		{name: "negative threshold", yaml: "routing: {local_prefill_below_tokens: -1}", wantErr: ErrInvalid},
		{name: "negative queue bound", yaml: "routing: {max_queued_prefill_tokens: -1}", wantErr: ErrInvalid},
		{name: "negative prefix weight", yaml: "routing: {weights: {prefill: {prefix: -1}}}", wantErr: ErrInvalid},
		{name: "removed prefix_weight", yaml: "routing: {prefix_weight: 1}", wantErr: ErrInvalid},
		{name: "negative weight", yaml: "routing: {weights: {decode: {kv: -1}}}", wantErr: ErrInvalid},
		{name: "nan weight", yaml: "routing: {weights: {prefill: {queue: .nan}}}", wantErr: ErrInvalid},
		{name: "infinite weight", yaml: "routing: {weights: {prefill: {queue: .inf}}}", wantErr: ErrInvalid},
		{name: "all decode weights zero", yaml: "routing: {weights: {decode: {prefix: 0, kv: 0, batch: 0}}}", wantErr: ErrInvalid},
		{name: "all prefill weights zero", yaml: "routing: {weights: {prefill: {prefix: 0, queue: 0}}}", wantErr: ErrInvalid},
		{name: "no kv weight for prefill", yaml: "routing: {weights: {prefill: {kv: 1}}}", wantErr: errAny},
		{name: "unknown weight", yaml: "routing: {weights: {decode: {lora: 1}}}", wantErr: errAny},
		{name: "busy queue without threshold", yaml: "routing: {prefill_queue_local_tokens: 100}", wantErr: ErrInvalid},
		{name: "busy threshold without queue", yaml: "routing: {busy_local_prefill_below_tokens: 100}", wantErr: ErrInvalid},
		{
			name:    "busy threshold not over the short one",
			yaml:    "routing: {local_prefill_below_tokens: 100, prefill_queue_local_tokens: 10, busy_local_prefill_below_tokens: 100}",
			wantErr: ErrInvalid,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse([]byte(tc.yaml))
			if tc.wantErr != nil {
				if err == nil || tc.wantErr == ErrInvalid && !errors.Is(err, ErrInvalid) {
					t.Fatalf("Parse error %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tc.want, p.Routing); diff != "" {
				t.Errorf("Routing (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantDecode, p.Routing.DecodeWeights()); diff != "" {
				t.Errorf("DecodeWeights (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantPrefill, p.Routing.PrefillWeights()); diff != "" {
				t.Errorf("PrefillWeights (-want +got):\n%s", diff)
			}
			if got := p.Routing.PrefixAware(false); got != tc.wantAware {
				t.Errorf("PrefixAware(disaggregated) = %v, want %v", got, tc.wantAware)
			}
			if got := p.Routing.PrefixAware(true); got != tc.wantAwareColocated {
				t.Errorf("PrefixAware(colocated) = %v, want %v", got, tc.wantAwareColocated)
			}
		})
	}
}

// TestRemovedPrefixWeight: a policy that still sets routing.prefix_weight
// (the former alias of weights.prefill.prefix) is refused at load with a
// message that names the key, its line and what to set instead, whatever
// its value.
func TestRemovedPrefixWeight(t *testing.T) {
	for _, yaml := range []string{
		"routing: {prefix_weight: 0.5}",
		"routing: {prefix_weight: 0}",
		"routing: {prefix_weight: 1, weights: {prefill: {prefix: 1}}}",
		"slo: {ttft_ms: 500}\nrouting:\n  local_prefill_below_tokens: 8\n  prefix_weight: 2\n",
	} {
		_, err := Parse([]byte(yaml))
		line := strings.Count(yaml[:strings.Index(yaml, "prefix_weight")], "\n") + 1
		want := fmt.Sprintf("line %d: routing.prefix_weight was removed: set routing.weights.prefill.prefix, the same weight", line)
		if !errors.Is(err, ErrInvalid) || !strings.HasSuffix(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an ErrInvalid ending %q", yaml, err, want)
		}
	}
}
