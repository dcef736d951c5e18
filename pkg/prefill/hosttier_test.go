package prefill

import (
	"fmt"
	"sync"
	"testing"
)

// hostOptions is cachedOptions with an engine tier of one entry and a
// host tier of hostBytes.
func hostOptions(hostBytes int64) Options {
	o := cachedOptions(1<<16, 1)
	o.PrefixCache.HostBytes = hostBytes
	return o
}

// TestHostTierBitExact: prompts evicted from the engine tier by later
// ones are loaded back from the host tier; the first token and the KV
// sent are the engine's without a cache, bit for bit, block-aligned or
// not, and the hit is reported.
func TestHostTierBitExact(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	w := newWorker(t, hostOptions(1<<30), true)
	base := prompt(70, 3)
	other := prompt(40, 4)
	prefillOne(t, w, f, addr, "base", base, 0)
	prefillOne(t, w, f, addr, "other", other, 0) // evicts base to the host tier
	if st := w.s.Stats().PrefixCache; st.Entries != 1 || st.Host.Entries != 1 || st.Host.Spills != 1 {
		t.Fatalf("after two prompts: %+v, want base in the host tier", st)
	}
	cached := [][]int32{base, other}
	for i, tc := range []struct{ n, shared int }{{70, 70}, {60, 48}, {50, 40}, {90, 70}} {
		p := base
		if tc.shared < tc.n {
			p = sharing(base, tc.n, tc.shared, int32(i+5))
		}
		id := fmt.Sprintf("h%d-%d-%d", i, tc.n, tc.shared)
		ev, _ := prefillOne(t, w, f, addr, id, p, 0)
		want := wantHit(p, cached)
		if got := int(ev.first.GetHit().GetTokens()); got != want || want == 0 {
			t.Errorf("%s: prefix_hit_tokens %d, want %d", id, got, want)
		}
		// The engine tier holds only the last prompt, which shares
		// nothing with base: the hit is the host tier's.
		if got := int(ev.first.GetHit().GetHostTokens()); got != want || ev.first.GetHit().GetHostLoadNanos() <= 0 {
			t.Errorf("%s: host_hit_tokens %d in %d ns, want %d loaded in some time", id, got, ev.first.GetHit().GetHostLoadNanos(), want)
		}
		cached = append(cached, p)
		// The next prompt evicts this one from the engine tier; base's
		// blocks stay in the host tier.
		prefillOne(t, w, f, addr, id+"-x", prompt(40, int32(20+i)), 0)
	}
	st := w.s.Stats().PrefixCache
	if st.Host.Hits != 4 || st.Host.HitTokens == 0 || st.Pinned != 0 {
		t.Errorf("cache stats %+v: want 4 host-tier hits", st)
	}
}

// TestHostTierOff: a host budget of 0 keeps today's behaviour: a prompt
// evicted from the engine tier is computed again.
func TestHostTierOff(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	w := newWorker(t, hostOptions(0), true)
	base := prompt(70, 3)
	prefillOne(t, w, f, addr, "base", base, 0)
	prefillOne(t, w, f, addr, "other", prompt(40, 4), 0)
	if ev, _ := prefillOne(t, w, f, addr, "again", base, 0); ev.first.GetHit().GetTokens() != 0 || ev.first.GetHit().GetHostTokens() != 0 {
		t.Errorf("prefix_hit_tokens %d after eviction without a host tier, want 0", ev.first.GetHit().GetTokens())
	}
	if st := w.s.Stats().PrefixCache; st.Host.Spills != 0 || st.Host.Lookups != 0 || w.s.cache.Host() != nil {
		t.Errorf("host tier stats %+v with a budget of 0", st.Host)
	}
}

// TestHostTierUnderPressure runs many requests at once over a small
// engine tier and a host tier of three prompts: entries move to the host
// and out of it while others load from it, and every result stays
// bit-exact. Run with -race.
func TestHostTierUnderPressure(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	o := cachedOptions(100, 2)
	o.PrefixCache.HostBytes = int64(3 * 48 * newEngine(t).Spec().KVBytesPerToken())
	w := newWorker(t, o, true)
	bases := [][]int32{prompt(48, 1), prompt(48, 2), prompt(48, 3), prompt(48, 4)}
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Go(func() {
			b := bases[i%len(bases)]
			p := sharing(b, 40+i, 16*(1+i%3), int32(i+20))
			prefillOne(t, w, f, addr, fmt.Sprintf("c%d", i), p, 0)
		})
	}
	wg.Wait()
	st := w.s.Stats().PrefixCache
	if st.Host.Bytes > o.PrefixCache.HostBytes || st.Host.Spills == 0 || st.Host.Evictions == 0 || st.Pinned != 0 {
		t.Errorf("cache stats %+v: want spills and evictions within %d host bytes", st, o.PrefixCache.HostBytes)
	}
	t.Logf("cache stats %+v", st)
}

// TestDiskTierBitExact: with a host tier of one prompt, the prompts it
// evicts go to the disk tier, and prompts sharing their prefix load it
// from there: the first token and the KV sent are the engine's without a
// cache, bit for bit.
func TestDiskTierBitExact(t *testing.T) {
	f := &fakeReceiver{}
	addr := serveReceiver(t, f)
	o := hostOptions(int64(64 * newEngine(t).Spec().KVBytesPerToken()))
	o.PrefixCache.DiskDir, o.PrefixCache.DiskBytes = t.TempDir(), 1<<30
	w := newWorker(t, o, true)
	base := prompt(70, 3)
	prefillOne(t, w, f, addr, "base", base, 0)
	cached := [][]int32{base}
	for i, tc := range []struct{ n, shared int }{{70, 70}, {60, 48}, {50, 40}} {
		// Two more prompts: base's blocks go to the host tier, then to
		// disk.
		for j := range 2 {
			p := prompt(40, int32(20+2*i+j))
			prefillOne(t, w, f, addr, fmt.Sprintf("x%d-%d", i, j), p, 0)
			cached = append(cached, p)
		}
		p := base
		if tc.shared < tc.n {
			p = sharing(base, tc.n, tc.shared, int32(i+5))
		}
		id := fmt.Sprintf("d%d-%d-%d", i, tc.n, tc.shared)
		ev, _ := prefillOne(t, w, f, addr, id, p, 0)
		want := wantHit(p, cached)
		if got := int(ev.first.GetHit().GetTokens()); got != want || want == 0 {
			t.Errorf("%s: prefix_hit_tokens %d, want %d", id, got, want)
		}
		if i == 0 && (int(ev.first.GetHit().GetDiskTokens()) != want || ev.first.GetHit().GetHostTokens() != ev.first.GetHit().GetDiskTokens()) {
			// base's blocks were on disk only.
			t.Errorf("%s: host_hit_tokens %d, disk_hit_tokens %d; want %d read from disk", id, ev.first.GetHit().GetHostTokens(), ev.first.GetHit().GetDiskTokens(), want)
		}
		cached = append(cached, p)
	}
	st := w.s.Stats().PrefixCache
	if st.Disk.Hits == 0 || st.Disk.Spills == 0 || st.Pinned != 0 {
		t.Errorf("cache stats %+v: want disk-tier spills and hits", st)
	}
}
