package control

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/pdserve/pdserve/internal/poll"
)

// TestKVIndexTiers: over NATS, a worker's host and disk tiers publish on
// subjects of their own and the index keeps each apart from the engine
// tier's view; all go with the worker.
func TestKVIndexTiers(t *testing.T) {
	nc := startNATS(t)
	ix := NewKVIndex(DefaultKVIndexMaxBlocks, nil)
	m := NewMembership(time.Minute)
	stop, err := WatchKV(context.Background(), nc, ix, m, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if got := KVTierSubject("prefill", "prefill-1", KVTierHost); got != "pdserve.kv.prefill.prefill-1.host" {
		t.Errorf("host tier subject %q", got)
	}
	if got := KVTierSubject("prefill", "prefill-1", KVTierDisk); got != "pdserve.kv.prefill.prefill-1.disk" {
		t.Errorf("disk tier subject %q", got)
	}
	if _, err := NewKVTierPublisher(nc, "prefill", "prefill-1", "tape", DefaultKVOptions(), nil); err == nil {
		t.Error("a publisher of an unknown tier: no error")
	}
	o := KVOptions{FlushInterval: time.Millisecond, SnapshotInterval: time.Hour, BatchHashes: 100}
	engine, host, disk := &fakeBlocks{set: map[uint64]bool{}}, &fakeBlocks{set: map[uint64]bool{}}, &fakeBlocks{set: map[uint64]bool{}}
	for tier, c := range map[string]*fakeBlocks{"": engine, KVTierHost: host, KVTierDisk: disk} {
		p, err := NewKVTierPublisher(nc, "prefill", "prefill-1", tier, o, c.AppendBlocks)
		if err != nil {
			t.Fatal(err)
		}
		c.mu.Lock()
		c.obs = p
		c.mu.Unlock()
		runKV(t, p)
	}
	var all []uint64
	for i := range 300 {
		h := uint64(i + 1)
		all = append(all, h)
		switch i % 3 {
		case 0:
			engine.store(h)
		case 1:
			host.store(h)
		default:
			disk.store(h)
		}
		if i%7 == 0 {
			host.remove(all[i/2])
			disk.remove(all[i/3])
		}
	}
	poll.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		for _, tier := range []struct {
			name  string
			cache *fakeBlocks
			view  *WorkerBlocks
		}{{"engine", engine, ix.Blocks("prefill-1")}, {"host", host, ix.HostBlocks("prefill-1")}, {"disk", disk, ix.DiskBlocks("prefill-1")}} {
			if tier.view == nil {
				return fmt.Errorf("no %s view", tier.name)
			}
			if diff := cmp.Diff(tier.cache.sorted(), blocksOf(tier.view, all), cmpopts.EquateEmpty()); diff != "" {
				return fmt.Errorf("%s view differs (-cache +index):\n%s", tier.name, diff)
			}
		}
		return nil
	})
	if err := ix.ApplyTier("prefill", "prefill-1", "tape", nil); err == nil {
		t.Error("ApplyTier of an unknown tier: no error")
	}
	ix.Drop("prefill-1")
	if ix.Blocks("prefill-1") != nil || ix.HostBlocks("prefill-1") != nil || ix.DiskBlocks("prefill-1") != nil {
		t.Error("views left after Drop")
	}
}
