package decode

import (
	"fmt"
	"testing"
)

// TestHostTierLocalBitExact generates, colocated, prompts whose shared
// prefix the engine tier (one entry) evicted to the host tier: they load
// it back, block-aligned or not, and the tokens are the engine's without
// a cache.
func TestHostTierLocalBitExact(t *testing.T) {
	o := cachedOptions(1024, 1)
	o.PrefixCache.HostBytes = 1 << 30
	w := newWorker(t, o, true)
	base := prompt(70, 3)
	generateLocal(t, w, "base", base, 6)
	for i, tc := range []struct{ n, shared int }{{70, 70}, {60, 48}, {50, 40}, {90, 70}} {
		// Another prompt takes the engine tier's one entry: base's
		// blocks are in the host tier only.
		generateLocal(t, w, fmt.Sprintf("x%d", i), prompt(40, int32(20+i)), 4)
		p := base
		if tc.shared < tc.n {
			p = sharing(base, tc.n, tc.shared, int32(i+5))
		}
		generateLocal(t, w, fmt.Sprintf("h%d", i), p, 6)
	}
	idle(t, w)
	st := w.s.Stats().PrefixCache
	if st.Host.Hits != 4 || st.Host.HitTokens != 64+48+32+64 || st.Host.Spills == 0 {
		t.Errorf("cache stats %+v: want 4 host-tier hits of 208 tokens", st)
	}
}
