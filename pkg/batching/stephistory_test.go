package batching

import (
	"slices"
	"testing"
	"time"
)

// TestStepHistory: the times are in milliseconds, oldest first, the last
// StepHistoryLen of them; LastBatch is the last step's; TimesMs is a copy.
func TestStepHistory(t *testing.T) {
	var h StepHistory
	if h.TimesMs() != nil || h.LastBatch() != 0 {
		t.Fatalf("zero value: %v, batch %d; want none", h.TimesMs(), h.LastBatch())
	}
	var want []float64
	for i := range StepHistoryLen + 3 {
		h.Record(time.Duration(i)*time.Millisecond+500*time.Microsecond, i+1)
		want = append(want, float64(i)+0.5)
		if len(want) > StepHistoryLen {
			want = want[1:]
		}
		if got := h.TimesMs(); !slices.Equal(got, want) {
			t.Fatalf("after %d steps: %v, want %v", i+1, got, want)
		}
		if got := h.LastBatch(); got != i+1 {
			t.Fatalf("after %d steps: last batch %d, want %d", i+1, got, i+1)
		}
	}
	got := h.TimesMs()
	got[0] = -1
	if h.TimesMs()[0] == -1 {
		t.Error("TimesMs shares its slice with the history")
	}
}
