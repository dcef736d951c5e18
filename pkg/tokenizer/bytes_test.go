package tokenizer

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/engine"
)

// Bytes is an engine's tokenizer; the check lives here, so that the
// package itself imports nothing of pdserve.
var _ engine.Tokenizer = Bytes{}

func TestBytesRoundTrip(t *testing.T) {
	for _, text := range []string{"", "hello", "héllo wörld ✓", "\x00\xff"} {
		ids := Bytes{}.Encode(text)
		if len(ids) != len(text) {
			t.Fatalf("Encode(%q): %d ids, want %d", text, len(ids), len(text))
		}
		if got := (Bytes{}).Decode(ids); got != text {
			t.Errorf("Decode(Encode(%q)) = %q", text, got)
		}
	}
}

func TestBytesSkipsSpecialIDs(t *testing.T) {
	got := Bytes{}.Decode([]int32{BOS, 'a', EOS, -1, 999, 'b'})
	if diff := cmp.Diff("ab", got); diff != "" {
		t.Errorf("Decode (-want +got):\n%s", diff)
	}
	if b := (Bytes{}).DecodeToken(EOS); b != nil {
		t.Errorf("DecodeToken(EOS) = %v, want nil", b)
	}
}
