package grpcauth

import (
	"context"
	"errors"
	"testing"
)

// TestCheckPullSequenceNamesOneRequest: a migration credential reads the
// sequence it was signed for only, and a Pull credential (a chain) reads
// no sequence.
func TestCheckPullSequenceNamesOneRequest(t *testing.T) {
	ctx := context.WithValue(context.Background(), claimsKey{}, Claims{Method: PullSequenceMethod, Chain: SequenceDigest("req-a")})
	if err := CheckPullSequence(ctx, "req-a"); err != nil {
		t.Errorf("its own request: %v", err)
	}
	if err := CheckPullSequence(ctx, "req-b"); !errors.Is(err, ErrWrongChain) {
		t.Errorf("another request: %v, want ErrWrongChain", err)
	}
	chain := context.WithValue(context.Background(), claimsKey{}, Claims{Method: PullMethod, Chain: ChainDigest([]uint64{1, 2})})
	if err := CheckPullSequence(chain, "req-a"); !errors.Is(err, ErrWrongChain) {
		t.Errorf("a chain's credential: %v, want ErrWrongChain", err)
	}
	if err := CheckPullSequence(context.Background(), "req-a"); err != nil {
		t.Errorf("a call admitted without a signed credential: %v", err)
	}
}
