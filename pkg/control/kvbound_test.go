package control

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pdserve/pdserve/internal/poll"
)

// eventsMsg encodes one events batch storing hs.
func eventsMsg(epoch, seq uint64, hs ...uint64) []byte {
	b := make([]byte, kvHeader, kvHeader+4+8*len(hs))
	putKVHeader(b, kvKindEvents, epoch, seq)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(hs)))
	for _, h := range hs {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return b
}

// snapshotMsg encodes a one-part snapshot of hs.
func snapshotMsg(epoch, seq uint64, hs ...uint64) []byte {
	return encodeSnapshotPart(nil, epoch, seq, 0, 1, hs)
}

// TestKVSnapshotBomb: a 34-byte snapshot part that announces 2^24 parts
// is refused and allocates next to nothing (the unfixed index sized a
// map of parts × hashes: hundreds of MB for this one, out of memory at
// 2^27).
func TestKVSnapshotBomb(t *testing.T) {
	ix := NewKVIndex(DefaultKVIndexMaxBlocks, nil)
	for _, parts := range []int{1 << 24, 1 << 27, 1<<32 - 1} {
		bomb := encodeSnapshotPart(nil, 7, 0, 0, parts, []uint64{42})
		if len(bomb) != 34 {
			t.Fatalf("bomb of %d bytes", len(bomb))
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := ix.Apply("decode", "d1", bomb)
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrBadKVMessage) {
			t.Errorf("parts %d: Apply = %v, want ErrBadKVMessage", parts, err)
		}
		if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
			t.Errorf("parts %d: allocated %d bytes", parts, got)
		}
	}
	// Within the cap, parts are believed only as hashes arrive.
	small := NewKVIndex(1000, nil)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := small.Apply("decode", "d1", encodeSnapshotPart(nil, 7, 0, 0, 1000, []uint64{1})); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<10 {
		t.Errorf("one hash of a 1000-part snapshot allocated %d bytes", got)
	}
	if got := small.Stats().Bytes; got != KVIndexEntryBytes {
		t.Errorf("index holds %d bytes, want one entry's %d", got, KVIndexEntryBytes)
	}
	if err := small.Apply("decode", "d1", encodeSnapshotPart(nil, 7, 0, 1, 1000, nil)); !errors.Is(err, ErrBadKVMessage) {
		t.Errorf("an empty part of 1000: %v, want ErrBadKVMessage", err)
	}
}

// TestKVIndexAdmittedOnly: an id the index does not admit is not
// indexed, whatever it sends; an admitted one is.
func TestKVIndexAdmittedOnly(t *testing.T) {
	o := DefaultKVIndexOptions()
	o.Admitted = func(role, id string) bool { return role == "decode" && id == "honest" }
	ix, err := NewKVIndexWith(o)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if err := ix.Apply("decode", fmt.Sprint("forged-", i), snapshotMsg(1, 0, uint64(i))); !errors.Is(err, ErrNotAdmitted) {
			t.Fatalf("forged id: %v, want ErrNotAdmitted", err)
		}
	}
	if err := ix.Apply("prefill", "honest", snapshotMsg(1, 0, 1)); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("admitted id under another role: %v, want ErrNotAdmitted", err)
	}
	if err := ix.Apply("decode", "honest", snapshotMsg(1, 0, 1, 2)); err != nil {
		t.Fatal(err)
	}
	if n, st := ix.Len(), ix.Stats(); n != 1 || st.NotAdmitted != 101 || st.Bytes != 2*KVIndexEntryBytes {
		t.Errorf("Len %d, stats %+v: want 1 worker, 101 not admitted, 2 entries", n, st)
	}
}

// TestKVIndexCaps: a worker's views stop at its cap; at the global cap
// the worker holding the most gives way, and the memory held stays under
// the cap.
func TestKVIndexCaps(t *testing.T) {
	o := KVIndexOptions{MaxBytes: 1000 * KVIndexEntryBytes, WorkerMaxBytes: 600 * KVIndexEntryBytes}
	ix, err := NewKVIndexWith(o)
	if err != nil {
		t.Fatal(err)
	}
	hashes := func(from, n int) []uint64 {
		hs := make([]uint64, n)
		for i := range hs {
			hs[i] = uint64(from + i)
		}
		return hs
	}
	// a: 700 hashes, 600 kept (host tier too: one cap for all tiers).
	if err := ix.Apply("decode", "a", snapshotMsg(1, 0, hashes(0, 500)...)); err != nil {
		t.Fatal(err)
	}
	if err := ix.ApplyTier("decode", "a", KVTierHost, snapshotMsg(2, 0, hashes(500, 200)...)); err == nil {
		t.Error("a beyond its cap: no error")
	}
	if st := ix.Stats(); st.Bytes != 600*KVIndexEntryBytes || st.LeftOut != 100 {
		t.Fatalf("after a: %+v, want 600 entries, 100 left out", st)
	}
	// b: 500 hashes; 400 fit, a gives way for the rest and more.
	if err := ix.Apply("decode", "b", snapshotMsg(3, 0, hashes(10000, 500)...)); err != nil {
		t.Fatal(err)
	}
	st := ix.Stats()
	if st.Bytes > o.MaxBytes || st.Evicted < 100 {
		t.Fatalf("after b: %+v, want at most %d bytes, 100 or more evicted", st, o.MaxBytes)
	}
	if got := ix.Blocks("b").State().Blocks; got != 500 {
		t.Errorf("b holds %d blocks, want 500", got)
	}
	a := ix.Blocks("a").State().Blocks + ix.HostBlocks("a").State().Blocks
	if int64(a+500)*KVIndexEntryBytes != st.Bytes {
		t.Errorf("a holds %d, b 500 blocks; the index counts %d bytes", a, st.Bytes)
	}
	// Dropping a worker gives its memory back.
	ix.Drop("a")
	ix.Drop("b")
	if st := ix.Stats(); st.Bytes != 0 {
		t.Errorf("after Drop: %d bytes held", st.Bytes)
	}
}

// TestKVFloodIsolation: a worker whose payloads are not applied (its
// OnStale blocks, as a slow apply would) and that floods its subject
// loses its own payloads, counted; another worker's events all arrive.
// With one queue for all workers (the unfixed code) the other worker's
// events wait behind the blocked one forever.
func TestKVFloodIsolation(t *testing.T) {
	nc := startNATS(t)
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
	o := DefaultKVIndexOptions()
	o.WorkerMaxBytes = 10 << 20 // a 2 MiB queue
	o.OnStale = func(role, id string) {
		if id == "flood" {
			<-release
		}
	}
	ix, err := NewKVIndexWith(o)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := WatchKV(context.Background(), nc, ix, NewMembership(time.Minute), time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	defer unblock() // before stop, which waits for the queues

	// Events without a snapshot: stale, OnStale blocks the flooder.
	big := make([]uint64, 8000)
	for i := range big {
		big[i] = uint64(i)
	}
	if err := nc.Publish(KVSubject("decode", "flood"), eventsMsg(9, 1, big...)); err != nil {
		t.Fatal(err)
	}
	other, err := nats.Connect(nc.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.Publish(KVSubject("prefill", "honest"), snapshotMsg(5, 0)); err != nil {
		t.Fatal(err)
	}
	const batches = 200
	for i := range batches {
		for range 2 {
			if err := nc.Publish(KVSubject("decode", "flood"), eventsMsg(9, uint64(i+2), big...)); err != nil {
				t.Fatal(err)
			}
		}
		if err := other.Publish(KVSubject("prefill", "honest"), eventsMsg(5, uint64(i+1), uint64(1000+i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	poll.CheckFor(t, 20*time.Second, 5*time.Millisecond, func() error {
		w := ix.Blocks("honest")
		if w == nil {
			return errors.New("no view of the honest worker")
		}
		if st := w.State(); st.Seq != batches || st.Gaps != 0 || st.Blocks != batches {
			return fmt.Errorf("honest worker's view %+v, want seq %d, no gap, %d blocks", st, batches, batches)
		}
		return nil
	})
	poll.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if st := ix.Stats(); st.QueueFull == 0 {
			return fmt.Errorf("stats %+v: the flooder lost nothing", st)
		}
		return nil
	})
}

// TestMaxPending: heartbeats of new ids beyond MaxPending members
// awaiting admission are refused and counted; admitted members and ids
// already pending are not.
func TestMaxPending(t *testing.T) {
	m := NewMembership(time.Minute, RequireAdmission(), MaxPending(2))
	now := time.Unix(0, 0)
	hb := func(id string) Heartbeat { return Heartbeat{ID: id, Role: "decode", GRPCAddr: "10.0.0.1:1"} }
	for _, id := range []string{"a", "b"} {
		if err := m.Observe(hb(id), now); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 1000 {
		err := m.Observe(hb(fmt.Sprint("forged-", i)), now)
		if i == 0 && !errors.Is(err, ErrPendingFull) {
			t.Fatalf("a third pending id: %v, want ErrPendingFull", err)
		}
	}
	if n, r := len(m.All()), m.PendingRefused(); n != 2 || r != 1000 {
		t.Fatalf("%d members, %d refused: want 2 and 1000", n, r)
	}
	if err := m.Observe(hb("a"), now); err != nil {
		t.Errorf("a pending id's next heartbeat: %v", err)
	}
	if !m.Admit("a", "decode", "10.0.0.1:1") {
		t.Fatal("a not admitted")
	}
	if err := m.Observe(hb("c"), now); err != nil {
		t.Errorf("room again after an admission: %v", err)
	}
	if err := m.Observe(hb("a"), now); err != nil {
		t.Errorf("an admitted member's heartbeat with the pending set full: %v", err)
	}
	if role, ok := m.Admitted("a"); !ok || role != "decode" {
		t.Errorf("Admitted(a) = %q, %v", role, ok)
	}
	if _, ok := m.Admitted("b"); ok {
		t.Error("Admitted(b) before its admission")
	}
}
