package region

import (
	"testing"
	"time"
)

// TestPeerRTTIsTheFloorOfRecentProbes: one probe delayed by a busy
// process does not make a near region look far; a region that became
// farther is seen as such once its last rttSamples probes all say so.
func TestPeerRTTIsTheFloorOfRecentProbes(t *testing.T) {
	var p Peer
	ms := time.Millisecond
	for _, rtt := range []time.Duration{20 * ms, 21 * ms, 1500 * ms, 22 * ms} {
		p.observeRTT(rtt)
	}
	if p.RTT != 20*ms {
		t.Fatalf("RTT after a 1.5 s probe among 20 ms ones: %v, want 20ms", p.RTT)
	}
	for range rttSamples {
		p.observeRTT(90 * ms)
	}
	if p.RTT != 90*ms {
		t.Fatalf("RTT after %d probes of 90 ms: %v, want 90ms", rttSamples, p.RTT)
	}
	var fresh Peer
	if fresh.RTT != 0 {
		t.Fatalf("unmeasured RTT %v, want 0", fresh.RTT)
	}
}
