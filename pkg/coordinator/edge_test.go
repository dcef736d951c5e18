package coordinator

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/coordinator/flow"
	"github.com/pdserve/pdserve/pkg/frontend"
	"github.com/pdserve/pdserve/pkg/wire"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// TestCallError: every gRPC code maps to the flow's class of it (the
// recoverable ones to broken or unavailable, as the flow recovers from
// them), a failed KV transfer and a refused grammar are marked, and the
// worker's error is kept.
func TestCallError(t *testing.T) {
	if callError(nil) != nil {
		t.Error("callError(nil) is not nil")
	}
	want := map[codes.Code]flow.Code{
		codes.Canceled: flow.CodeBroken, codes.Unknown: flow.CodeBroken, codes.InvalidArgument: flow.CodeInvalid,
		codes.DeadlineExceeded: flow.CodeBroken, codes.NotFound: flow.CodeRefused, codes.AlreadyExists: flow.CodeRefused,
		codes.PermissionDenied: flow.CodeRefused, codes.ResourceExhausted: flow.CodeFull, codes.FailedPrecondition: flow.CodeLost,
		codes.Aborted: flow.CodeBroken, codes.OutOfRange: flow.CodeInvalid, codes.Unimplemented: flow.CodeRefused,
		codes.Internal: flow.CodeBroken, codes.Unavailable: flow.CodeUnavailable, codes.DataLoss: flow.CodeRefused,
		codes.Unauthenticated: flow.CodeRefused,
	}
	for c := codes.Canceled; c <= codes.Unauthenticated; c++ {
		err := status.Error(c, "x")
		got := callError(err)
		if got.Code != want[c] || got.Transfer || got.Grammar || !errors.Is(got, err) {
			t.Errorf("callError(%v) = %+v; want code %v, unmarked, wrapping it", c, got, want[c])
		}
	}
	if got := callError(errors.New("no status")); got.Code != flow.CodeBroken {
		t.Errorf("an error without a status: %v, want broken", got.Code)
	}
	tr := callError(fmt.Errorf("prefill: %w", wire.KVTransferFailedStatus("r", "d:1", status.Error(codes.FailedPrecondition, "no reservation"))))
	if !tr.Transfer || tr.Code != flow.CodeLost {
		t.Errorf("a failed transfer: %+v, want marked, lost", tr)
	}
	if g := callError(wire.GrammarRefusedStatus("none")); !g.Grammar || g.Code != flow.CodeLost {
		t.Errorf("a refused grammar: %+v, want marked, lost", g)
	}
}

// TestClientError: each failure kind the client can act on becomes the
// frontend error of its HTTP class with the coordinator's own message,
// and keeps its cause; an internal failure and the shell's own errors
// pass unchanged.
func TestClientError(t *testing.T) {
	req := &frontend.Request{Model: "m", Prompt: make([]int32, 10), MaxTokens: 5, N: 2}
	cause := errors.New("worker said so")
	for _, tc := range []struct {
		f         *flow.Failure
		kind      error
		code, msg string
	}{
		{&flow.Failure{Kind: flow.KindInvalid, Part: "prefill"}, frontend.ErrInvalid, "invalid_request", "The prefill worker cannot serve the request as asked."},
		{&flow.Failure{Kind: flow.KindOverloaded, Part: "decode"}, frontend.ErrOverloaded, "overloaded", "The decode workers have no room for the request now (queue full); retry later."},
		{&flow.Failure{Kind: flow.KindUnavailable, Part: "KV transfer"}, frontend.ErrUnavailable, "unavailable", "The KV transfer worker is unavailable; retry later."},
		{&flow.Failure{Kind: flow.KindNoKVRoom}, frontend.ErrOverloaded, "overloaded", "No decode worker has free KV cache for 20 tokens now; retry later."},
		{&flow.Failure{Kind: flow.KindQueuesFull}, frontend.ErrOverloaded, "overloaded", "Every prefill worker's queue is full; retry later."},
		{&flow.Failure{Kind: flow.KindNoWorkers}, frontend.ErrUnavailable, "no_workers", `No worker serving model "m" can take the request now; retry later.`},
		{&flow.Failure{Kind: flow.KindDecodeFailed}, frontend.ErrUnavailable, "decode_failed", "The request failed on 4 decode workers in turn; retry later."},
		{&flow.Failure{Kind: flow.KindNotRecovered}, frontend.ErrUnavailable, "decode_failed", "The decode worker serving the request failed and no other decode worker could take it; retry later."},
	} {
		t.Run(tc.f.Kind.String(), func(t *testing.T) {
			tc.f.Cause = cause
			err := clientError(fmt.Errorf("wrapped: %w", tc.f), req)
			var fe *frontend.Error
			if !errors.As(err, &fe) || !errors.Is(err, tc.kind) || !errors.Is(err, cause) {
				t.Fatalf("clientError = %v; want a frontend.Error of %v wrapping the cause", err, tc.kind)
			}
			if diff := cmp.Diff([2]string{tc.code, tc.msg}, [2]string{fe.Code, fe.Message}); diff != "" {
				t.Errorf("code and message (-want +got):\n%s", diff)
			}
		})
	}
	for _, err := range []error{&flow.Failure{Kind: flow.KindInternal, Cause: cause}, cause} {
		if got := clientError(err, req); got != err {
			t.Errorf("clientError(%v) = %v, want it unchanged", err, got)
		}
	}
}

// TestTokensEvent: a Generate message's fields reach the flow, the
// first stamp of a kind wins, and unknown stamps are skipped, as are the
// KV stamps of a decode worker (the KV's arrival reaches the flow once,
// from the prefill stream's kv_done).
func TestTokensEvent(t *testing.T) {
	resp := &pdservev1.GenerateResponse{Index: 1, Tokens: []int32{4, 5}, Finish: pdservev1.FinishReason_FINISH_REASON_LENGTH, BatchSize: 3,
		Hit:      &pdservev1.PrefixHit{Tokens: 32, HostTokens: 16, PeerLoadNanos: 7},
		Logprobs: []*pdservev1.TokenLogprob{{Token: 4, Logprob: -1}, {Token: 5, Logprob: -2}},
		Stamps: []*pdservev1.Stamp{{Kind: pdservev1.StampKind_STAMP_KIND_PREFILL_START, UnixNano: 10}, {Kind: pdservev1.StampKind_STAMP_KIND_PREFILL_START, UnixNano: 20},
			{Kind: pdservev1.StampKind_STAMP_KIND_KV_FIRST_BYTE, UnixNano: 25}, {Kind: pdservev1.StampKind_STAMP_KIND_KV_DONE, UnixNano: 28},
			{Kind: pdservev1.StampKind(99), UnixNano: 30}, {UnixNano: 35}, {Kind: pdservev1.StampKind_STAMP_KIND_DECODE_JOINED, UnixNano: 40}}}
	got := tokensEvent(2, resp)
	if got.Attempt != 2 || got.Index != 1 || !cmp.Equal(got.Tokens, []int32{4, 5}) || got.Finish != "length" ||
		got.Batch != 3 || got.Hits != (flow.Hits{Prefix: 32, Host: 16, PeerLoad: 7}) || len(got.Logprobs) != 2 || got.Logprobs[1].Logprob != -2 {
		t.Errorf("tokensEvent = %+v", got)
	}
	if want := (flow.Stamps{PrefillStart: time.Unix(0, 10), DecodeJoined: time.Unix(0, 40)}); got.Stamps != want {
		t.Errorf("stamps %+v, want %+v", got.Stamps, want)
	}
	if ev := prefillEvent(0, &pdservev1.PrefillResponse{}); ev != nil {
		t.Errorf("an empty Prefill message: %#v, want none", ev)
	}
}

// TestPrefixHitBothCarriers: the one PrefixHit message reaches the flow
// alike from the prefill worker's FirstToken and a decode worker's
// Generate event, every field of it; nil is no hit.
func TestPrefixHitBothCarriers(t *testing.T) {
	h := &pdservev1.PrefixHit{Tokens: 64, HostTokens: 48, HostLoadNanos: 5, DiskTokens: 16, PeerTokens: 16, PeerLoadNanos: 9}
	want := flow.Hits{Prefix: 64, Host: 48, HostLoad: 5, Disk: 16, Peer: 16, PeerLoad: 9}
	ev := prefillEvent(1, &pdservev1.PrefillResponse{Event: &pdservev1.PrefillResponse_FirstToken{FirstToken: &pdservev1.FirstToken{Token: 3, Hit: h}}})
	if ft, ok := ev.(flow.FirstToken); !ok || ft.Hits != want {
		t.Errorf("FirstToken event %#v, want hits %+v", ev, want)
	}
	if got := tokensEvent(1, &pdservev1.GenerateResponse{Hit: h}).Hits; got != want {
		t.Errorf("Generate event hits %+v, want %+v", got, want)
	}
	if got := tokensEvent(1, &pdservev1.GenerateResponse{}).Hits; got != (flow.Hits{}) {
		t.Errorf("Generate event without a hit: %+v, want none", got)
	}
}

// TestTokensEventLegacyFinish: a decode worker that predates
// GenerateResponse.finish sends only its finish_reason string, which
// still finishes the choice; finish wins over it when both are set.
func TestTokensEventLegacyFinish(t *testing.T) {
	for _, tc := range []struct {
		resp *pdservev1.GenerateResponse
		want string
	}{
		{&pdservev1.GenerateResponse{FinishReason: "stop"}, vocab.FinishStop},
		{&pdservev1.GenerateResponse{FinishReason: "length"}, vocab.FinishLength},
		{&pdservev1.GenerateResponse{FinishReason: "stop", Finish: pdservev1.FinishReason_FINISH_REASON_LENGTH}, vocab.FinishLength},
		{&pdservev1.GenerateResponse{FinishReason: "bogus"}, ""},
		{&pdservev1.GenerateResponse{}, ""},
	} {
		if got := tokensEvent(0, tc.resp).Finish; got != tc.want {
			t.Errorf("finish of %v = %q, want %q", tc.resp, got, tc.want)
		}
	}
}
