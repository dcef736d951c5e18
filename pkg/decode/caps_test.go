package decode

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
)

// fromIP is a call context from a gRPC peer at ip, which grpcauth.Caller
// names "ip:<ip>" when no identity was authenticated.
func fromIP(ip string) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 4000}})
}

// Each caller may hold at most MaxReservationsPerCaller requests and
// MaxReservedTokensPerCaller tokens; over either cap Reserve fails with
// RESOURCE_EXHAUSTED naming it, other callers are not affected, and what
// a request held is given back when it ends.
func TestReservationCapsPerCaller(t *testing.T) {
	o := smallOptions() // 64 blocks of 16 tokens
	o.MaxReservationsPerCaller = 3
	o.MaxReservedTokensPerCaller = 8 * 16
	w := newWorker(t, o, true)
	const a, b = "10.0.0.1", "10.0.0.2"
	for _, step := range []struct {
		name   string
		caller string
		cancel bool // cancel id instead of reserving
		id     string
		tokens int32
		want   codes.Code
		msg    string // in the refusal
	}{
		{"first", a, false, "a1", 16, codes.OK, ""},
		{"second", a, false, "a2", 32, codes.OK, ""},
		{"over the token cap", a, false, "a3", 6*16 + 1, codes.ResourceExhausted, "max-reserved-tokens-per-caller"},
		{"up to the token cap", a, false, "a3", 5 * 16, codes.OK, ""},
		{"over the count cap", a, false, "a4", 1, codes.ResourceExhausted, "max-reservations-per-caller"},
		{"another caller", b, false, "b1", 8 * 16, codes.OK, ""},
		{"another caller over its own cap", b, false, "b2", 1, codes.ResourceExhausted, "caller ip:10.0.0.2"},
		{"an end gives back", a, true, "a3", 0, codes.OK, ""},
		{"room again", a, false, "a4", 5 * 16, codes.OK, ""},
	} {
		var err error
		if step.cancel {
			_, err = w.s.Cancel(fromIP(step.caller), &pdservev1.CancelRequest{RequestId: step.id})
		} else {
			_, err = w.s.Reserve(fromIP(step.caller), &pdservev1.ReserveRequest{RequestId: step.id, Tokens: step.tokens})
		}
		if status.Code(err) != step.want || step.msg != "" && !strings.Contains(err.Error(), step.msg) {
			t.Errorf("%s: %v, want %v with %q", step.name, err, step.want, step.msg)
		}
	}
	for _, id := range []string{"a1", "a2", "a4", "b1"} {
		w.s.CancelRequest(id)
	}
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	if len(w.s.callers) != 0 {
		t.Errorf("after every request ended, callers hold %v", w.s.callers)
	}
}

// A Generate call without a reservation counts against its caller's caps,
// and so does a Generate that grows its reservation.
func TestGenerateCountsAgainstCaps(t *testing.T) {
	o := smallOptions()
	o.MaxReservationsPerCaller = 1
	o.MaxReservedTokensPerCaller = 4 * 16
	w := newWorker(t, o, true)
	ctx := testCtx(t)
	// Over gRPC from loopback the caller is ip:127.0.0.1.
	if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "r", Tokens: 16}); err != nil {
		t.Fatal(err)
	}
	gen := func(id string, prompt, maxTokens int) error {
		stream, err := w.client.Generate(ctx, &pdservev1.GenerateRequest{RequestId: id, PromptTokens: make([]int32, prompt), MaxTokens: int32(maxTokens), LocalPrefill: true, IgnoreEos: true})
		if err != nil {
			return err
		}
		_, err = collect(stream)
		return err
	}
	if err := gen("other", 4, 4); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max-reservations-per-caller") {
		t.Errorf("Generate without a reservation at the count cap: %v, want RESOURCE_EXHAUSTED", err)
	}
	if err := gen("r", 40, 40); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max-reserved-tokens-per-caller") {
		t.Errorf("Generate growing past the token cap: %v, want RESOURCE_EXHAUSTED", err)
	}
	// The refused Generate left the reservation; within the cap it runs.
	if err := gen("r", 8, 8); err != nil {
		t.Errorf("Generate within the caps: %v", err)
	}
	if err := gen("next", 8, 8); err != nil {
		t.Errorf("Generate after the request ended: %v", err)
	}
}

func TestCapsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Options)
	}{
		{"no request cap", func(o *Options) { o.MaxReservationsPerCaller = 0 }},
		{"negative token cap", func(o *Options) { o.MaxReservedTokensPerCaller = -1 }},
	} {
		o := DefaultOptions()
		tc.edit(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "per-caller") {
			t.Errorf("%s: Validate = %v, want an error", tc.name, err)
		}
	}
}
