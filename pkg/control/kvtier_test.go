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

// TestKVIndexHostTier: over NATS, a worker's host tier publishes on its
// own subject and the index keeps it apart from the engine tier's view;
// both go with the worker.
func TestKVIndexHostTier(t *testing.T) {
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
	if _, err := NewKVTierPublisher(nc, "prefill", "prefill-1", "disk", DefaultKVOptions(), nil); err == nil {
		t.Error("a publisher of an unknown tier: no error")
	}
	o := KVOptions{FlushInterval: time.Millisecond, SnapshotInterval: time.Hour, BatchHashes: 100}
	engine, host := &fakeBlocks{set: map[uint64]bool{}}, &fakeBlocks{set: map[uint64]bool{}}
	for tier, c := range map[string]*fakeBlocks{"": engine, KVTierHost: host} {
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
		if i%3 == 0 {
			engine.store(h)
		} else {
			host.store(h)
		}
		if i%7 == 0 {
			host.remove(all[i/2])
		}
	}
	poll.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		for name, v := range map[string]*WorkerBlocks{"engine": ix.Blocks("prefill-1"), "host": ix.HostBlocks("prefill-1")} {
			c := engine
			if name == "host" {
				c = host
			}
			if v == nil {
				return fmt.Errorf("no %s view", name)
			}
			if diff := cmp.Diff(c.sorted(), blocksOf(v, all), cmpopts.EquateEmpty()); diff != "" {
				return fmt.Errorf("%s view differs (-cache +index):\n%s", name, diff)
			}
		}
		return nil
	})
	if err := ix.ApplyTier("prefill", "prefill-1", "disk", nil); err == nil {
		t.Error("ApplyTier of an unknown tier: no error")
	}
	ix.Drop("prefill-1")
	if ix.Blocks("prefill-1") != nil || ix.HostBlocks("prefill-1") != nil {
		t.Error("views left after Drop")
	}
}
