package flow

import (
	"testing"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/router"
)

// BenchmarkRequest steps one disaggregated request of 16 output tokens
// through a Machine, from Start to Finish: the flow's share of a
// request's coordinator overhead.
//
//	go test -run '^$' -bench Request ./pkg/coordinator/flow/
func BenchmarkRequest(b *testing.B) {
	d, p := router.Worker{ID: "d0", Addr: "d0:7000"}, router.Worker{ID: "p0", Addr: "p0:7000"}
	first := &pdservev1.PrefillResponse{Event: &pdservev1.PrefillResponse_FirstToken{FirstToken: &pdservev1.FirstToken{Token: 1}}}
	kvDone := &pdservev1.PrefillResponse{Event: &pdservev1.PrefillResponse_KvDone{KvDone: &pdservev1.KVDone{}}}
	gens := make([]*pdservev1.GenerateResponse, 16)
	for i := range gens {
		gens[i] = &pdservev1.GenerateResponse{Tokens: []int32{int32(i + 1)}}
	}
	gens[15].FinishReason = "length"
	b.ReportAllocs()
	for range b.N {
		m, err := NewMachine(Config{ID: "req-1", PromptTokens: 1024, MaxTokens: 16, Mode: ModeDisaggregated, Policy: PolicyPrefill, Trace: &budget.Trace{}})
		if err != nil {
			b.Fatal(err)
		}
		steps := []Event{Start{}, Routed{Decision: router.Decision{Decode: d, Prefill: p}}, Reserved{},
			PrefillMsg{Resp: first}, Delivered{}, PrefillMsg{Resp: kvDone}, PrefillEnded{}}
		for _, ev := range steps {
			m.Step(ev)
		}
		for _, g := range gens {
			if acts := m.Step(GenerateMsg{Resp: g}); len(acts) > 0 {
				m.Step(Delivered{})
			}
		}
		m.Step(GenerateEnded{})
		if !m.Done() || m.Err() != nil {
			b.Fatalf("request not done: %v", m.Err())
		}
	}
}
