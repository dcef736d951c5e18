package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/coordinator/flow"
	"github.com/pdserve/pdserve/pkg/frontend"
)

// failingBackend completes every request with err (nil: finished).
type failingBackend struct{ err error }

func (b failingBackend) Complete(context.Context, *frontend.Request, frontend.EmitFunc) ([]string, error) {
	if b.err != nil {
		return nil, b.err
	}
	return []string{"stop"}, nil
}

// recordingExt records what an extension is told.
type recordingExt struct {
	mu       sync.Mutex
	observed []string
	refused  []string
	retried  []string // served retries of a refusal it heard of
}

func (e *recordingExt) ObserveServedRetry(t *budget.Trace) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.retried = append(e.retried, t.RequestID)
}

// traceExt is an Extension that is no RefusalObserver: it records the
// traces it observes.
type traceExt struct{ recorded []string }

func (*traceExt) Attach(Host) error              { return nil }
func (*traceExt) Run(ctx context.Context)        { <-ctx.Done() }
func (e *traceExt) ObserveTrace(t *budget.Trace) { e.recorded = append(e.recorded, t.RequestID) }

func (*recordingExt) Attach(Host) error       { return nil }
func (*recordingExt) Run(ctx context.Context) { <-ctx.Done() }
func (e *recordingExt) ObserveTrace(t *budget.Trace) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.observed = append(e.observed, t.RequestID)
}
func (e *recordingExt) ObserveRefused(t *budget.Trace, maxTokens int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.refused = append(e.refused, fmt.Sprintf("%s %d+%d", t.RequestID, t.PromptTokens, maxTokens))
}

// TestObservedRefusals: the extensions observe a completed request's
// trace; a RefusalObserver also hears of a request the pools refused for
// want of room (each capacity failure the client gets as 429), with its
// max_tokens; a request that failed otherwise (no workers, a failed
// decode, the client gone) is observed by neither.
func TestObservedRefusals(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		refused bool
	}{
		{name: "completed"},
		{name: "no KV room", err: &flow.Failure{Kind: flow.KindNoKVRoom}, refused: true},
		{name: "prefill queues full", err: &flow.Failure{Kind: flow.KindQueuesFull}, refused: true},
		{name: "decode overloaded", err: &flow.Failure{Kind: flow.KindOverloaded, Part: "decode"}, refused: true},
		{name: "no workers", err: &flow.Failure{Kind: flow.KindNoWorkers}},
		{name: "decode failed", err: &flow.Failure{Kind: flow.KindDecodeFailed}},
		{name: "client gone", err: context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &frontend.Request{Model: "m", Prompt: make([]int32, 12), MaxTokens: 30, N: 1,
				Trace: &budget.Trace{RequestID: "r1", Arrival: time.Now(), PromptTokens: 12}}
			var err error
			if tc.err != nil {
				err = clientError(fmt.Errorf("flow: %w", tc.err), req)
			}
			ext := &recordingExt{}
			b := observed(failingBackend{err: err}, []Extension{ext}, nil, time.Now)
			_, got := b.Complete(context.Background(), req, nil)
			if !errors.Is(got, err) {
				t.Fatalf("Complete = %v, want %v", got, err)
			}
			wantObserved, wantRefused := 0, 0
			switch {
			case tc.err == nil:
				wantObserved = 1
			case tc.refused:
				wantRefused = 1
			}
			if len(ext.observed) != wantObserved || len(ext.refused) != wantRefused {
				t.Errorf("observed %q, refused %q; want %d observed, %d refused", ext.observed, ext.refused, wantObserved, wantRefused)
			}
			if wantRefused == 1 && ext.refused[0] != "r1 12+30" {
				t.Errorf("refusal %q, want the trace's prompt and max_tokens (r1 12+30)", ext.refused[0])
			}
		})
	}
}

// TestObservedForwards: a request another region served instead is
// demand for the RefusalObservers, with its prompt and max_tokens, as a
// refused one is; the other extensions do not observe it (it was not
// served here: none of its terms were measured here).
func TestObservedForwards(t *testing.T) {
	ext := &recordingExt{}
	b := observed(failingBackend{}, []Extension{ext}, nil, time.Now)
	fo, ok := b.(frontend.ForwardObserver)
	if !ok {
		t.Fatalf("%T is not a frontend.ForwardObserver: the frontend would not report forwarded requests", b)
	}
	fo.ObserveForwarded(&frontend.Request{Model: "m", Prompt: make([]int32, 7), MaxTokens: 40, N: 1,
		Trace: &budget.Trace{RequestID: "f1", Arrival: time.Now(), PromptTokens: 7}})
	if len(ext.observed) != 0 || len(ext.refused) != 1 || ext.refused[0] != "f1 7+40" {
		t.Errorf("observed %q, refused %q; want none observed and the forwarded request as demand (f1 7+40)", ext.observed, ext.refused)
	}
}

// TestRefusalRetriesCountedOnce: a client's retry of a refused request
// (Retry ≥ 1, the same tenant, route, model, prompt, max_tokens and n)
// within refusalTTL of the counted refusal is not passed to the
// RefusalObservers again, whether refused again or served by another
// region, and pdserve_planner_refusal_retries_total counts it; a request
// the client does not mark as a retry, a retry differing in any of those,
// one after the TTL and one whose refusal was pushed out by refusalCap
// newer ones are counted.
func TestRefusalRetriesCountedOnce(t *testing.T) {
	overloaded := clientError(fmt.Errorf("flow: %w", &flow.Failure{Kind: flow.KindNoKVRoom}), &frontend.Request{})
	ext := &recordingExt{}
	reg := prometheus.NewRegistry()
	var now atomic.Int64 // seconds
	clock := func() time.Time { return time.Unix(now.Load(), 0) }
	b := observed(failingBackend{err: overloaded}, []Extension{ext}, reg, clock)
	fo := b.(frontend.ForwardObserver)
	n := 0
	req := func(id string, retry int, edit func(*frontend.Request)) *frontend.Request {
		r := &frontend.Request{Tenant: "t1", Route: frontend.RouteCompletions, Model: "m", Prompt: []int32{5, 6, 7}, MaxTokens: 30, N: 1,
			Retry: retry, Trace: &budget.Trace{RequestID: id, Arrival: clock(), PromptTokens: 3}}
		if edit != nil {
			edit(r)
		}
		return r
	}
	step := func(what string, r *frontend.Request, forwarded, counted bool) {
		t.Helper()
		if forwarded {
			fo.ObserveForwarded(r)
		} else if _, err := b.Complete(context.Background(), r, nil); !errors.Is(err, overloaded) {
			t.Fatalf("%s: Complete = %v", what, err)
		}
		if counted {
			n++
		}
		if len(ext.refused) != n {
			t.Fatalf("%s: %d refusals heard of, want %d (counted: %v): %q", what, len(ext.refused), n, counted, ext.refused)
		}
	}
	step("first try", req("a", 0, nil), false, true)
	now.Add(2)
	step("its retry 1", req("a1", 1, nil), false, false)
	now.Add(8)
	step("its retry 2, served by another region", req("a2", 2, nil), true, false)
	step("the same prompt, not marked a retry", req("b", 0, nil), false, true)
	for what, edit := range map[string]func(*frontend.Request){
		"another tenant":     func(r *frontend.Request) { r.Tenant = "t2" },
		"another model":      func(r *frontend.Request) { r.Model = "m2" },
		"another route":      func(r *frontend.Request) { r.Route = frontend.RouteChat },
		"another prompt":     func(r *frontend.Request) { r.Prompt = []int32{5, 6, 8} },
		"another max_tokens": func(r *frontend.Request) { r.MaxTokens = 31 },
		"another n":          func(r *frontend.Request) { r.N = 2 },
	} {
		step("a retry of "+what, req("c", 1, edit), false, true)
	}
	retries := func() float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "pdserve_planner_refusal_retries_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		t.Fatal("no pdserve_planner_refusal_retries_total")
		return 0
	}
	if got := retries(); got != 2 {
		t.Errorf("pdserve_planner_refusal_retries_total %v, want 2", got)
	}
	// "b" counted the fingerprint again at +10 s: a retry at +69 s is
	// within its minute, one at +70 s is not.
	now.Add(59)
	step("a retry 59 s after the last count", req("d", 1, nil), false, false)
	now.Add(1)
	step("a retry a minute after the last count", req("e", 1, nil), false, true)
	for i := range refusalCap {
		step("filler", req("f", 0, func(r *frontend.Request) { r.Prompt = []int32{int32(i), -1} }), false, true)
	}
	step("a retry whose refusal refusalCap newer ones pushed out", req("g", 1, nil), false, true)
}

// TestServedRetryObservedAsSuch: a request served on its client's retry
// of a refusal the RefusalObservers heard of goes to a RetryObserver's
// ObserveServedRetry instead of ObserveTrace (it was demand when
// refused), and counts in pdserve_planner_refusal_retries_total; an
// extension that is no RetryObserver observes it as any request. A
// served request that retries no counted refusal, or is not marked a
// retry, is observed as usual.
func TestServedRetryObservedAsSuch(t *testing.T) {
	overloaded := clientError(fmt.Errorf("flow: %w", &flow.Failure{Kind: flow.KindNoKVRoom}), &frontend.Request{})
	ext, plain := &recordingExt{}, &traceExt{}
	reg := prometheus.NewRegistry()
	be := &failingBackend{err: overloaded} // through the pointer: the test changes err
	b := observed(be, []Extension{ext, plain}, reg, time.Now)
	req := func(id string, retry int, prompt ...int32) *frontend.Request {
		return &frontend.Request{Tenant: "t", Route: frontend.RouteChat, Model: "m", Prompt: prompt, MaxTokens: 9, N: 1, Retry: retry,
			Trace: &budget.Trace{RequestID: id, Arrival: time.Now(), PromptTokens: len(prompt)}}
	}
	b.Complete(context.Background(), req("refused", 0, 1, 2), nil)
	be.err = nil
	for _, r := range []*frontend.Request{req("retry", 1, 1, 2), req("unmarked", 0, 1, 2), req("other", 1, 3, 4)} {
		if _, err := b.Complete(context.Background(), r, nil); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"refused 2+9"}; fmt.Sprint(ext.refused) != fmt.Sprint(want) {
		t.Errorf("refused %q, want %q", ext.refused, want)
	}
	if want := []string{"retry"}; fmt.Sprint(ext.retried) != fmt.Sprint(want) {
		t.Errorf("served retries %q, want %q", ext.retried, want)
	}
	if want := []string{"unmarked", "other"}; fmt.Sprint(ext.observed) != fmt.Sprint(want) {
		t.Errorf("observed %q, want %q", ext.observed, want)
	}
	if want := []string{"retry", "unmarked", "other"}; fmt.Sprint(plain.recorded) != fmt.Sprint(want) {
		t.Errorf("an extension that is no RetryObserver observed %q, want %q", plain.recorded, want)
	}
	if got := testutil.ToFloat64(b.(observingBackend).counted.retries); got != 1 {
		t.Errorf("pdserve_planner_refusal_retries_total %v, want 1", got)
	}
}
