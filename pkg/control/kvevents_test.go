package control

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/pdserve/pdserve/internal/poll"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// fakeBlocks stands in for a prefix cache: a set of hashes whose changes
// are reported to obs under its lock, as prefixcache.Cache does.
type fakeBlocks struct {
	mu  sync.Mutex
	set map[uint64]bool
	obs *KVPublisher
}

func (f *fakeBlocks) store(h uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.set[h] {
		f.set[h] = true
		if f.obs != nil {
			f.obs.Stored(h)
		}
	}
}

func (f *fakeBlocks) remove(h uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.set[h] {
		delete(f.set, h)
		if f.obs != nil {
			f.obs.Removed(h)
		}
	}
}

func (f *fakeBlocks) AppendBlocks(dst []uint64, mark func()) []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	for h := range f.set {
		dst = append(dst, h)
	}
	mark()
	return dst
}

func (f *fakeBlocks) sorted() []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]uint64, 0, len(f.set))
	for h := range f.set {
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}

// blocksOf returns the hashes of set among candidates, sorted.
func blocksOf(w *WorkerBlocks, candidates []uint64) []uint64 {
	var out []uint64
	for _, h := range candidates {
		if w.Has(h) {
			out = append(out, h)
		}
	}
	slices.Sort(out)
	return out
}

func runKV(t *testing.T, p *KVPublisher) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var err error
	wg.Go(func() { err = p.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if err != nil {
			t.Errorf("KVPublisher.Run: %v", err)
		}
	})
}

// TestKVIndexFollowsPublisher: over NATS, the index of a worker equals
// its cache after stores and removals, more of them than a batch holds
// and than a heartbeat digest carries.
func TestKVIndexFollowsPublisher(t *testing.T) {
	nc := startNATS(t)
	ix := NewKVIndex(DefaultKVIndexMaxBlocks, nil)
	m := NewMembership(time.Minute)
	stop, err := WatchKV(context.Background(), nc, ix, m, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	cache := &fakeBlocks{set: map[uint64]bool{}}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 100 {
		cache.store(rng.Uint64()) // before the publisher: only its snapshot tells
	}
	o := KVOptions{FlushInterval: time.Millisecond, SnapshotInterval: time.Hour, BatchHashes: 1000}
	p, err := NewKVPublisher(nc, "decode", "decode-1", o, cache.AppendBlocks)
	if err != nil {
		t.Fatal(err)
	}
	cache.mu.Lock()
	cache.obs = p
	cache.mu.Unlock()
	runKV(t, p)

	all := cache.sorted()
	for i := range 10000 {
		h := rng.Uint64()
		all = append(all, h)
		cache.store(h)
		if i%3 == 0 {
			cache.remove(all[rng.IntN(len(all))])
		}
	}
	poll.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		w := ix.Blocks("decode-1")
		if w == nil {
			return errors.New("no view of decode-1")
		}
		if diff := cmp.Diff(cache.sorted(), blocksOf(w, all), cmpopts.EquateEmpty()); diff != "" {
			return fmt.Errorf("index differs from the cache (-cache +index):\n%s", diff)
		}
		if st := w.State(); st.Blocks != len(cache.sorted()) || st.Stale {
			return fmt.Errorf("state %+v, want %d blocks, not stale", st, len(cache.sorted()))
		}
		return nil
	})
	if st := ix.Blocks("decode-1").State(); st.Seq < 10 || st.Gaps != 0 || st.Snapshots != 1 {
		t.Errorf("state %+v: want ≥ 10 batches, no gap, the start snapshot only", st)
	}
}

// TestKVIndexHealsLostBatch: over NATS, a batch lost leaves the index
// wrong and stale; onStale asks for a snapshot once, which heals it. So
// for each tier's stream: the engine's, the host's and the disk's.
func TestKVIndexHealsLostBatch(t *testing.T) {
	for _, tier := range kvTiers {
		name := tier
		if name == "" {
			name = "engine"
		}
		t.Run(name, func(t *testing.T) { healsLostBatch(t, tier) })
	}
}

// healsLostBatch is TestKVIndexHealsLostBatch on tier's stream.
func healsLostBatch(t *testing.T, tier string) {
	nc := startNATS(t)
	var mu sync.Mutex
	var asked []string
	var p *KVPublisher
	ix := NewKVIndex(DefaultKVIndexMaxBlocks, func(role, id string) {
		mu.Lock()
		asked = append(asked, role+"/"+id)
		mu.Unlock()
	})
	stop, err := WatchKV(context.Background(), nc, ix, NewMembership(time.Minute), time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	cache := &fakeBlocks{set: map[uint64]bool{}}
	o := KVOptions{FlushInterval: time.Hour, SnapshotInterval: time.Hour, BatchHashes: 2}
	if p, err = NewKVTierPublisher(nc, "prefill", "prefill-0", tier, o, cache.AppendBlocks); err != nil {
		t.Fatal(err)
	}
	cache.obs = p
	if err := p.snapshot(); err != nil { // what Run does first
		t.Fatal(err)
	}
	settled := func(want []uint64, stale bool) {
		t.Helper()
		poll.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
			w := ix.tierBlocks(tier, "prefill-0")
			if w == nil {
				return errors.New("no view")
			}
			if got := blocksOf(w, []uint64{1, 2, 3, 4, 5, 6}); !slices.Equal(got, want) || w.State().Stale != stale {
				return fmt.Errorf("index holds %v (stale %v), want %v (stale %v)", got, w.State().Stale, want, stale)
			}
			return nil
		})
	}
	settled(nil, false)
	cache.store(1)
	cache.store(2) // batch 1, full
	if err := p.flush(); err != nil {
		t.Fatal(err)
	}
	settled([]uint64{1, 2}, false)
	cache.store(3)
	cache.store(4) // batch 2: lost
	p.mu.Lock()
	p.queued = nil
	p.mu.Unlock()
	cache.store(5)
	cache.remove(1) // batch 3
	if err := p.flush(); err != nil {
		t.Fatal(err)
	}
	settled([]uint64{2, 5}, true)
	mu.Lock()
	if !slices.Equal(asked, []string{"prefill/prefill-0"}) {
		t.Errorf("onStale told %v, want prefill/prefill-0 once", asked)
	}
	mu.Unlock()
	cache.store(6) // batch 4, after the gap: applied, still stale
	cache.remove(2)
	if err := p.flush(); err != nil {
		t.Fatal(err)
	}
	settled([]uint64{5, 6}, true)
	if err := p.snapshot(); err != nil {
		t.Fatal(err)
	}
	settled([]uint64{3, 4, 5, 6}, false)
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 1 {
		t.Errorf("onStale told %v, want once per gap", asked)
	}
	if st := ix.tierBlocks(tier, "prefill-0").State(); st.Gaps != 1 || st.Snapshots != 2 {
		t.Errorf("state %+v, want one gap and two snapshots", st)
	}
}

// events returns one events payload of seq with the given runs.
func events(epoch, seq uint64, stored, removed []uint64) []byte {
	p := &KVPublisher{o: KVOptions{BatchHashes: 1 << 20}, epoch: epoch, runAt: -1, seq: seq - 1}
	p.cur = p.newBatch()
	for _, h := range stored {
		p.add(h, false)
	}
	for _, h := range removed {
		p.add(h, true)
	}
	p.cutLocked()
	return p.queued[0]
}

func snap(epoch, seq uint64, part, parts int, hs ...uint64) []byte {
	return encodeSnapshotPart(nil, epoch, seq, part, parts, hs)
}

// TestKVIndexApply walks one worker's view through payloads in order,
// duplicated, from a restarted worker, and in parts.
func TestKVIndexApply(t *testing.T) {
	type step struct {
		data      []byte
		want      []uint64 // blocks among 1..9; nil with noView
		noView    bool
		stale     bool
		wantAsked int
	}
	steps := []struct {
		name string
		step
	}{
		{"events before any snapshot", step{data: events(7, 3, []uint64{1}, nil), noView: true, wantAsked: 1}},
		{"snapshot at 3", step{data: snap(7, 3, 0, 1, 1, 2), want: []uint64{1, 2}, wantAsked: 1}},
		{"a batch the snapshot holds", step{data: events(7, 3, []uint64{9}, nil), want: []uint64{1, 2}, wantAsked: 1}},
		{"the next batch", step{data: events(7, 4, []uint64{3}, []uint64{1}), want: []uint64{2, 3}, wantAsked: 1}},
		{"a gap", step{data: events(7, 6, []uint64{4}, nil), want: []uint64{2, 3, 4}, stale: true, wantAsked: 2}},
		{"an older snapshot", step{data: snap(7, 5, 0, 1, 8), want: []uint64{2, 3, 4}, stale: true, wantAsked: 2}},
		{"part 0 of 3", step{data: snap(7, 6, 0, 3, 5), want: []uint64{2, 3, 4}, stale: true, wantAsked: 2}},
		{"part 2 of 3: part 1 lost", step{data: snap(7, 6, 2, 3, 6), want: []uint64{2, 3, 4}, stale: true, wantAsked: 2}},
		{"parts 0", step{data: snap(7, 6, 0, 2, 5), want: []uint64{2, 3, 4}, stale: true, wantAsked: 2}},
		{"and 1 of 2", step{data: snap(7, 6, 1, 2, 6), want: []uint64{5, 6}, wantAsked: 2}},
		{"a restarted worker's events", step{data: events(8, 1, []uint64{7}, nil), noView: true, wantAsked: 3}},
		{"its snapshot", step{data: snap(8, 0, 0, 1), want: nil, wantAsked: 3}},
		{"its first batch", step{data: events(8, 1, []uint64{7}, nil), want: []uint64{7}, wantAsked: 3}},
	}
	asked := 0
	ix := NewKVIndex(100, func(role, id string) {
		if role != "decode" || id != "d" {
			t.Errorf("onStale(%s, %s)", role, id)
		}
		asked++
	})
	for _, s := range steps {
		if err := ix.Apply("decode", "d", s.data); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		w := ix.Blocks("d")
		if s.noView {
			if w != nil {
				t.Errorf("%s: a view before a snapshot", s.name)
			}
		} else if w == nil {
			t.Errorf("%s: no view", s.name)
		} else if got := blocksOf(w, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9}); !slices.Equal(got, s.want) || w.State().Stale != s.stale {
			t.Errorf("%s: view %v (stale %v), want %v (stale %v)", s.name, got, w.State().Stale, s.want, s.stale)
		}
		if asked != s.wantAsked {
			t.Errorf("%s: onStale told %d times, want %d", s.name, asked, s.wantAsked)
		}
	}
	if got := ix.Blocks("d").Match([]uint64{7, 8}); got != 1 {
		t.Errorf("Match = %d, want 1", got)
	}
}

func TestKVIndexBoundAndRetain(t *testing.T) {
	ix := NewKVIndex(3, nil)
	if err := ix.Apply("decode", "a", snap(1, 0, 0, 1, 1, 2, 3, 4)); err == nil {
		t.Error("a snapshot beyond the bound: no error")
	}
	if err := ix.Apply("decode", "a", events(1, 1, []uint64{5}, nil)); err == nil {
		t.Error("a store beyond the bound: no error")
	}
	if st := ix.Blocks("a").State(); st.Blocks != 3 {
		t.Errorf("%d blocks held, want the bound 3", st.Blocks)
	}
	if err := ix.Apply("prefill", "b", snap(1, 0, 0, 1)); err != nil {
		t.Fatal(err)
	}
	member := func(id string) bool { return id == "b" }
	ix.Retain(member)
	if ix.Len() != 2 {
		t.Errorf("one Retain dropped a view: %d left", ix.Len())
	}
	ix.Retain(member)
	if ix.Blocks("a") != nil || ix.Blocks("b") == nil || ix.Len() != 1 {
		t.Errorf("two Retains: %d views, a %v; want b's only", ix.Len(), ix.Blocks("a") != nil)
	}
	ix.Drop("b")
	if ix.Len() != 0 {
		t.Error("Drop left a view")
	}
}

func TestDecodeKVRefuses(t *testing.T) {
	good := events(1, 1, []uint64{1}, nil)
	for name, data := range map[string][]byte{
		"empty":          nil,
		"short header":   good[:10],
		"version":        append([]byte{2}, good[1:]...),
		"kind":           append([]byte{1, 9}, good[2:]...),
		"no run":         good[:kvHeader],
		"run cut short":  good[:len(good)-1],
		"zero run":       append(slices.Clone(good[:kvHeader]), 0, 0, 0, 0),
		"snapshot short": snap(1, 1, 0, 1, 5)[:kvSnapHeader+3],
		"part ≥ parts":   snap(1, 1, 2, 2),
	} {
		if _, err := decodeKV(data); !errors.Is(err, ErrBadKVMessage) {
			t.Errorf("%s: err %v, want ErrBadKVMessage", name, err)
		}
		ix := NewKVIndex(10, nil)
		if err := ix.Apply("decode", "d", data); !errors.Is(err, ErrBadKVMessage) || ix.Len() != 0 {
			t.Errorf("%s: Apply err %v, %d views; want ErrBadKVMessage and none", name, err, ix.Len())
		}
	}
}

func TestKVOptionsValidate(t *testing.T) {
	if err := DefaultKVOptions().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	err := KVOptions{}.Validate()
	for _, want := range []string{"flush interval", "kv-snapshot-interval", "batch"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("zero options: err %v, want it to name %q", err, want)
		}
	}
	if _, err := NewKVPublisher(nil, "decode", "a.b", DefaultKVOptions(), nil); !errors.Is(err, ErrBadToken) {
		t.Errorf("bad id: %v", err)
	}
}

// TestKVEventPermissions: a decode user cannot publish another worker's
// KV events of any tier (the server drops them, the coordinator's index
// never hears of it), publishes its own of every tier (engine, host,
// disk), and a prefill worker cannot read them.
func TestKVEventPermissions(t *testing.T) {
	core, serverLogs := observer.New(zap.DebugLevel)
	coord := NewNATSUser(RoleCoordinator, "")
	d1 := NewNATSUser(RoleDecode, "decode-1")
	p0 := NewNATSUser(RolePrefill, "prefill-0")
	url := startAuthNATS(t, []NATSUser{coord, d1, p0}, zap.New(core))
	cnc := connectAs(t, url, coord.ConnOptions(), nil)
	ix := NewKVIndex(DefaultKVIndexMaxBlocks, nil)
	stop, err := WatchKV(context.Background(), cnc, ix, NewMembership(time.Minute), time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	dcore, dlogs := observer.New(zap.DebugLevel)
	dnc := connectAs(t, url, d1.ConnOptions(), zap.New(dcore))
	for _, subj := range []string{KVSubject("decode", "decode-2"), KVSubject("prefill", "decode-1"),
		KVTierSubject("decode", "decode-2", KVTierHost), KVTierSubject("decode", "decode-2", KVTierDisk)} {
		if err := dnc.Publish(subj, snap(1, 0, 0, 1, 42)); err != nil {
			t.Fatal(err)
		}
		logged(t, dlogs, "nats error", `Permissions Violation for Publish to "`+subj+`"`)
		logged(t, serverLogs, "Publish Violation", subj)
	}
	for _, tier := range kvTiers {
		if err := dnc.Publish(KVTierSubject("decode", "decode-1", tier), snap(1, 0, 0, 1, 42)); err != nil {
			t.Fatal(err)
		}
	}
	poll.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
		for _, tier := range kvTiers {
			if w := ix.tierBlocks(tier, "decode-1"); w == nil || !w.Has(42) {
				return fmt.Errorf("decode-1's own snapshot of tier %q not indexed", tier)
			}
		}
		return nil
	})
	if ix.Len() != 1 {
		t.Errorf("%d views, want decode-1's only", ix.Len())
	}

	pcore, plogs := observer.New(zap.DebugLevel)
	pnc := connectAs(t, url, p0.ConnOptions(), zap.New(pcore))
	if _, err := pnc.SubscribeSync(KVWildcard); err != nil {
		t.Fatal(err)
	}
	logged(t, plogs, "nats error", `Permissions Violation for Subscription to "pdserve.kv.>"`)
}
