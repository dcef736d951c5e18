package decode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/grammar"
)

// A choice whose grammar state is being computed sits steps out, and
// only it: with the grammar workers held busy, a request under a grammar
// streams its first token (sampled under the start state's mask,
// computed in the call) and then waits, while a neighbour without one
// decodes all its tokens. Once the workers are free the grammar request
// ends with the same tokens as when nothing held it (greedy): a skipped
// step changes only timing. On a loop that computed states itself, the
// request would not wait; on one that masked a state not ready, the
// neighbour would wait with it.
func TestGrammarSitsOut(t *testing.T) {
	w := newWorker(t, smallOptions(), true)
	p := prompt(9, 3)
	run := func(id string, sampling *pdservev1.Sampling, max int32, streamed *atomic.Int64) ([]int32, error) {
		stream, err := w.client.Generate(context.Background(), &pdservev1.GenerateRequest{RequestId: id, PromptTokens: p, MaxTokens: max, IgnoreEos: sampling == nil, LocalPrefill: true, Sampling: sampling})
		if err != nil {
			return nil, err
		}
		var got []int32
		for {
			ev, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return got, nil
			}
			if err != nil {
				return got, err
			}
			got = append(got, ev.GetTokens()...)
			if streamed != nil {
				streamed.Add(int64(len(ev.GetTokens())))
			}
		}
	}
	guided := &pdservev1.Sampling{Grammar: grammar.JSONObject}
	want, err := run("free", guided, 12, nil)
	if err != nil || len(want) < 3 {
		t.Fatalf("free: %d tokens, %v", len(want), err)
	}

	// Hold the grammar workers.
	block, started := make(chan struct{}), make(chan struct{})
	w.s.offload.Go(0, func() { close(started); <-block })
	<-started
	var streamed atomic.Int64
	type res struct {
		tokens []int32
		err    error
	}
	done := make(chan res, 1)
	go func() {
		got, err := run("held", guided, 12, &streamed)
		done <- res{got, err}
	}()
	checkFor(t, 30*time.Second, func() error {
		if n := streamed.Load(); n < 1 {
			return fmt.Errorf("%d tokens streamed", n)
		}
		return nil
	})
	neighbour := make(chan error, 1)
	go func() {
		got, err := run("neighbour", nil, 16, nil)
		if err == nil && len(got) != 16 {
			err = fmt.Errorf("%d tokens, want 16", len(got))
		}
		neighbour <- err
	}()
	select {
	case err := <-neighbour:
		if err != nil {
			t.Fatalf("neighbour: %v", err)
		}
	case <-time.After(30 * time.Second):
		close(block)
		t.Fatal("the neighbour did not finish while a grammar state waited for its workers")
	}
	if n := streamed.Load(); n != 1 {
		t.Errorf("%d tokens of the grammar request streamed while its next state could not be computed, want 1", n)
	}
	close(block)
	r := <-done
	if r.err != nil || !slices.Equal(r.tokens, want) {
		t.Errorf("held: %v, %v; want %v as when free", r.tokens, r.err, want)
	}
}

// A grammar over a compile budget is refused in the call, INVALID_ARGUMENT
// naming the limit (the coordinator's 400), before anything reaches the
// batch: here a start state over grammar.MaxStateBytes (100 nested rules
// over 4,000 alternatives).
func TestGrammarOverCompileBudget(t *testing.T) {
	var b strings.Builder
	b.WriteString("root ::= r0\n")
	for i := range 100 {
		fmt.Fprintf(&b, "r%d ::= r%d \"x\"\n", i, i+1)
	}
	b.WriteString("r100 ::= ")
	for i := range 4000 {
		if i > 0 {
			b.WriteString(" | ")
		}
		fmt.Fprintf(&b, "[\\u%04x]", 0x100+i)
	}
	w := newWorker(t, smallOptions(), true)
	stream, err := w.client.Generate(testCtx(t), &pdservev1.GenerateRequest{RequestId: "big", PromptTokens: prompt(9, 3), MaxTokens: 8, N: 4, LocalPrefill: true, Sampling: &pdservev1.Sampling{Grammar: b.String()}})
	if err == nil {
		_, err = collect(stream)
	}
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "state bytes") {
		t.Fatalf("%v, want InvalidArgument naming the state bytes limit", err)
	}
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	if n := len(w.s.seqs); n != 0 {
		t.Errorf("%d requests held after the refusal", n)
	}
}
