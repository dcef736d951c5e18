package workerrun

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/engine/ref"
)

// TestKVEventsHostTier: the blocks a worker's engine tier evicts to its
// host tier reach a coordinator's index as the host tier's view, equal to
// the host tier, apart from the engine tier's.
func TestKVEventsHostTier(t *testing.T) {
	url := startNATS(t)
	o := testOptions(control.RoleColocated, url)
	o.ID = "colocated-host"
	o.Decode.PrefixCache.MaxTokens = 160 // three 49-token prompts: later ones evict
	o.Decode.PrefixCache.HostBytes = 1 << 30
	w := startWorker(t, o)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ix := control.NewKVIndex(control.DefaultKVIndexMaxBlocks, nil)
	stop, err := control.WatchKV(context.Background(), nc, ix, control.NewMembership(time.Minute), time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	all := prefillLocal(t, w, o, "host-", 200)
	if st := w.cur().svc.(decodeService).Stats().PrefixCache; st.Host.Spills == 0 {
		t.Fatalf("cache stats %+v: want spills to the host tier", st)
	}
	poll.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if h, i := sortedBlocks(w.cur().svc.hostBlocks()), indexed(ix.HostBlocks(o.ID), all); len(h) == 0 || !slices.Equal(h, i) {
			return fmt.Errorf("host tier index %x, host tier %x", i, h)
		}
		engine := sortedBlocks(w.cur().svc.prefixBlocks())
		if i := indexed(ix.Blocks(o.ID), all); !slices.Equal(engine, i) {
			return fmt.Errorf("engine tier index %x, engine tier %x", i, engine)
		}
		return nil
	})
}

// TestKVEventsDiskTier: the blocks a worker's host tier evicts to its
// disk tier reach a coordinator's index as the disk tier's view, equal to
// the disk tier, apart from the other tiers' views; a snapshot command
// covers it.
func TestKVEventsDiskTier(t *testing.T) {
	url := startNATS(t)
	o := testOptions(control.RoleColocated, url)
	o.ID = "colocated-disk"
	eng, err := ref.New(ref.Options{Preset: o.Engine.Preset, MaxSeqLen: 256})
	if err != nil {
		t.Fatal(err)
	}
	o.Decode.PrefixCache.MaxTokens = 160 // three 49-token prompts: later ones evict
	// One prompt's three blocks on the host: the one before goes to disk.
	o.Decode.PrefixCache.HostBytes = int64(48 * eng.Spec().KVBytesPerToken())
	o.Decode.PrefixCache.DiskDir = t.TempDir()
	o.Decode.PrefixCache.DiskBytes = 1 << 30
	w := startWorker(t, o)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ix := control.NewKVIndex(control.DefaultKVIndexMaxBlocks, nil)
	stop, err := control.WatchKV(context.Background(), nc, ix, control.NewMembership(time.Minute), time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	all := prefillLocal(t, w, o, "disk-", 300)
	if st := w.cur().svc.(decodeService).Stats().PrefixCache; st.Disk.Spills == 0 {
		t.Fatalf("cache stats %+v: want spills to the disk tier", st)
	}
	disk := diskBlocks(w.cur().svc.hostBlocks())
	if disk == nil {
		t.Fatal("no disk tier blocks")
	}
	poll.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		for _, tier := range []struct {
			name  string
			cache []uint64
			view  *control.WorkerBlocks
		}{
			{"engine", sortedBlocks(w.cur().svc.prefixBlocks()), ix.Blocks(o.ID)},
			{"host", sortedBlocks(w.cur().svc.hostBlocks()), ix.HostBlocks(o.ID)},
			{"disk", sortedBlocks(disk), ix.DiskBlocks(o.ID)},
		} {
			if i := indexed(tier.view, all); len(tier.cache) == 0 || !slices.Equal(tier.cache, i) {
				return fmt.Errorf("%s tier index %x, %s tier %x", tier.name, i, tier.name, tier.cache)
			}
		}
		return nil
	})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := control.SendCommand(ctx, nc, string(o.Role), o.ID, control.Command{Kind: control.CmdKVSnapshot}); err != nil {
		t.Fatalf("kv snapshot command: %v", err)
	}
	poll.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if st := ix.DiskBlocks(o.ID).State(); st.Snapshots < 2 || st.Stale {
			return fmt.Errorf("disk tier state %+v: want the start snapshot and the commanded one", st)
		}
		return nil
	})
}
