package wire

import (
	"testing"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// TestStampKindsOneToOne: every stamp of vocab has its own wire kind and
// comes back from it, and every wire kind but the unspecified one is a
// stamp of vocab: a kind added to the proto without its Go stamp (or the
// reverse) fails here.
func TestStampKindsOneToOne(t *testing.T) {
	seen := map[pdservev1.StampKind]vocab.Stamp{}
	for _, s := range vocab.Stamps {
		k := StampKind(s)
		if k == pdservev1.StampKind_STAMP_KIND_UNSPECIFIED {
			t.Errorf("stamp %d has no wire kind", s)
			continue
		}
		if o, ok := seen[k]; ok {
			t.Errorf("stamps %d and %d share wire kind %v", o, s, k)
		}
		seen[k] = s
		if back := FromStampKind(k); back != s {
			t.Errorf("FromStampKind(%v) = %d, want %d", k, back, s)
		}
	}
	for n := range pdservev1.StampKind_name {
		k := pdservev1.StampKind(n)
		if _, ok := seen[k]; !ok && k != pdservev1.StampKind_STAMP_KIND_UNSPECIFIED {
			t.Errorf("wire kind %v is no stamp of vocab", k)
		}
	}
	for _, k := range []pdservev1.StampKind{pdservev1.StampKind_STAMP_KIND_UNSPECIFIED, 99} {
		if s := FromStampKind(k); s != 0 {
			t.Errorf("FromStampKind(%v) = %d, want none", k, s)
		}
	}
}

// TestFinishReasons: each finish reason of vocab has its own wire value
// and comes back from it; every wire value but the unspecified one is one
// of them; "" (not finished) is unspecified. SetFinish writes the string
// too, for a coordinator that predates finish, and Finish reads it back
// from either.
func TestFinishReasons(t *testing.T) {
	reasons := []string{vocab.FinishStop, vocab.FinishLength}
	seen := map[pdservev1.FinishReason]bool{}
	for _, r := range reasons {
		f := FinishReason(r)
		if f == pdservev1.FinishReason_FINISH_REASON_UNSPECIFIED || seen[f] {
			t.Errorf("FinishReason(%q) = %v: unspecified or shared", r, f)
		}
		seen[f] = true
		if back := FromFinishReason(f); back != r {
			t.Errorf("FromFinishReason(%v) = %q, want %q", f, back, r)
		}
		resp := &pdservev1.GenerateResponse{}
		SetFinish(resp, r)
		if resp.GetFinish() != f || resp.GetFinishReason() != r || Finish(resp) != r {
			t.Errorf("SetFinish(%q): finish %v, finish_reason %q, Finish %q", r, resp.GetFinish(), resp.GetFinishReason(), Finish(resp))
		}
		if got := Finish(&pdservev1.GenerateResponse{FinishReason: r}); got != r {
			t.Errorf("Finish of a worker that predates finish, %q: %q", r, got)
		}
	}
	for n := range pdservev1.FinishReason_name {
		if f := pdservev1.FinishReason(n); !seen[f] && f != pdservev1.FinishReason_FINISH_REASON_UNSPECIFIED {
			t.Errorf("wire finish %v is no finish reason of vocab", f)
		}
	}
	resp := &pdservev1.GenerateResponse{}
	SetFinish(resp, "")
	if resp.GetFinish() != pdservev1.FinishReason_FINISH_REASON_UNSPECIFIED || resp.GetFinishReason() != "" || Finish(resp) != "" {
		t.Errorf("SetFinish(\"\") = %v", resp)
	}
}

// TestPriorities: each priority of vocab has its own wire value and comes
// back from it; every named wire value maps to one; unspecified is
// interactive and an unknown value is refused. Fails if a priority maps
// to a shared or unspecified value, or an unknown one is taken for one.
func TestPriorities(t *testing.T) {
	seen := map[pdservev1.Priority]bool{}
	for _, p := range []vocab.Priority{vocab.PriorityInteractive, vocab.PriorityBatch} {
		w := Priority(p)
		if w == pdservev1.Priority_PRIORITY_UNSPECIFIED || seen[w] {
			t.Errorf("Priority(%d) = %v: unspecified or shared", p, w)
		}
		seen[w] = true
		if back, err := FromPriority(w); err != nil || back != p {
			t.Errorf("FromPriority(%v) = %d, %v; want %d", w, back, err, p)
		}
	}
	for n := range pdservev1.Priority_name {
		w := pdservev1.Priority(n)
		if _, err := FromPriority(w); err != nil {
			t.Errorf("FromPriority(%v): %v", w, err)
		}
	}
	if p, err := FromPriority(pdservev1.Priority_PRIORITY_UNSPECIFIED); err != nil || p != vocab.PriorityInteractive {
		t.Errorf("FromPriority(unspecified) = %d, %v; want interactive", p, err)
	}
	if _, err := FromPriority(99); err == nil {
		t.Error("FromPriority(99): no error")
	}
}
