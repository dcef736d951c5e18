package control

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/poll"
)

// TestWatchKVAsksSnapshotOnceAdmitted: the snapshot of a worker whose
// heartbeat of its role has not been seen yet (an elastic worker's new
// role: the membership has it as decode, it publishes as prefill) is
// dropped as not admitted; once the membership has the role, WatchKV
// tells OnStale, whose snapshot request heals the view at once instead
// of at the next periodic snapshot (an hour here).
//
// It fails without the refused workers' OnStale in WatchKV's tick: no
// ask comes, and the view stays empty.
func TestWatchKVAsksSnapshotOnceAdmitted(t *testing.T) {
	nc := startNATS(t)
	m := NewMembership(time.Minute)
	hb := Heartbeat{ID: "e-1", Role: "decode", GRPCAddr: "10.0.0.1:1"}
	if err := m.Observe(hb, time.Now()); err != nil {
		t.Fatal(err)
	}
	asked := make(chan [2]string, 16)
	ix, err := NewKVIndexWith(KVIndexOptions{
		MaxBytes: DefaultKVIndexMaxBytes, WorkerMaxBytes: DefaultKVIndexWorkerMaxBytes,
		Admitted: func(role, id string) bool { r, ok := m.Admitted(id); return ok && r == role },
		OnStale: func(role, id string) {
			select {
			case asked <- [2]string{role, id}:
			default:
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop, err := WatchKV(context.Background(), nc, ix, m, 5*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	cache := &fakeBlocks{set: map[uint64]bool{}}
	cache.store(7)
	cache.store(9)
	p, err := NewKVPublisher(nc, "prefill", "e-1", KVOptions{FlushInterval: time.Millisecond, SnapshotInterval: time.Hour, BatchHashes: 100}, cache.AppendBlocks)
	if err != nil {
		t.Fatal(err)
	}
	runKV(t, p)
	poll.WaitFor(t, "the snapshot dropped as not admitted", func() bool { return ix.Stats().NotAdmitted > 0 })
	select {
	case a := <-asked:
		t.Fatalf("OnStale(%s, %s) before the worker was admitted in its role", a[0], a[1])
	default:
	}

	hb.Role = "prefill"
	if err := m.Observe(hb, time.Now()); err != nil {
		t.Fatal(err)
	}
	var a [2]string
	select {
	case a = <-asked:
	case <-time.After(20 * time.Second):
		t.Fatal("OnStale not told of the worker admitted in its new role")
	}
	if a != [2]string{"prefill", "e-1"} {
		t.Errorf("OnStale(%s, %s), want (prefill, e-1)", a[0], a[1])
	}
	p.RequestSnapshot() // what the coordinator's CmdKVSnapshot does
	poll.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		w := ix.Blocks("e-1")
		if w == nil {
			return errors.New("no view of e-1")
		}
		if !w.Has(7) || !w.Has(9) {
			return fmt.Errorf("view %+v lacks a block", w.State())
		}
		return nil
	})
}
