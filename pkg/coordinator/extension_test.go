package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

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
}

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
			b := observed(failingBackend{err: err}, []Extension{ext})
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
	b := observed(failingBackend{}, []Extension{ext})
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
