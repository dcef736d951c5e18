package flow

import (
	"testing"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/router"
)

// BenchmarkRequest steps one disaggregated request of 16 output tokens
// through a Machine, from Start to Finish, applying its budget records as
// the shell does: the flow's share of a request's coordinator overhead.
//
//	go test -run '^$' -bench Request ./pkg/coordinator/flow/
func BenchmarkRequest(b *testing.B) {
	d, p := router.Worker{ID: "d0", Addr: "d0:7000"}, router.Worker{ID: "p0", Addr: "p0:7000"}
	gens := make([]Tokens, 16)
	for i := range gens {
		gens[i] = Tokens{Tokens: []int32{int32(i + 1)}}
	}
	gens[15].Finish = "length"
	b.ReportAllocs()
	for range b.N {
		m, err := NewMachine(Config{ID: "req-1", PromptTokens: 1024, MaxTokens: 16, Mode: ModeDisaggregated, Policy: PolicyPrefill})
		if err != nil {
			b.Fatal(err)
		}
		var tr budget.Trace
		step := func(ev Event) []Action {
			acts := m.Step(ev)
			for _, a := range acts {
				if r, ok := a.(Record); ok {
					r.Budget.Apply(&tr)
				}
			}
			return acts
		}
		steps := []Event{Start{}, Routed{Decision: router.Decision{Decode: d, Prefill: p}}, Reserved{},
			FirstToken{Token: 1}, Delivered{}, KVDone{}, PrefillEnded{}}
		for _, ev := range steps {
			step(ev)
		}
		for _, g := range gens {
			for _, a := range step(g) {
				if _, ok := a.(Deliver); ok {
					step(Delivered{})
				}
			}
		}
		step(GenerateEnded{})
		if !m.Done() || m.Err() != nil {
			b.Fatalf("request not done: %v", m.Err())
		}
	}
}
