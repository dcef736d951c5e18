package budget

import (
	"testing"
	"time"
)

// TestHostTierFields: the host tier's share of the prefix hit and its
// load time are in the summary and the log line when the worker loaded
// from its host tier, and absent from both when it did not.
func TestHostTierFields(t *testing.T) {
	tr := Trace{RequestID: "r1", Status: StatusOK, PrefixHitTokens: 64}
	for _, key := range []string{"host_prefix_hit_tokens", "host_load_ms"} {
		if got, inJSON, _, _ := summaryAndLog(t, &tr, key); inJSON {
			t.Errorf("%s %v in the summary of an engine-memory hit", key, got)
		}
	}
	if _, _, got, inLog := summaryAndLog(t, &tr, "host_load"); inLog {
		t.Errorf("host_load %v in the log line of an engine-memory hit", got)
	}
	tr.HostHitTokens, tr.HostLoad = 48, 2500*time.Microsecond
	if got := tr.Terms().HostLoad; got != tr.HostLoad {
		t.Errorf("Terms.HostLoad %v, want %v", got, tr.HostLoad)
	}
	if got, _, logged, _ := summaryAndLog(t, &tr, "host_prefix_hit_tokens"); got != 48.0 || logged != int64(48) {
		t.Errorf("host_prefix_hit_tokens: summary %v (%T), log %v (%T); want 48", got, got, logged, logged)
	}
	if got, _, _, _ := summaryAndLog(t, &tr, "host_load_ms"); got != 2.5 {
		t.Errorf("summary host_load_ms %v, want 2.5", got)
	}
	if _, _, logged, _ := summaryAndLog(t, &tr, "host_load"); logged != 2500*time.Microsecond {
		t.Errorf("log host_load %v (%T), want 2.5ms", logged, logged)
	}
}
