package router

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// ids summarises a decision for diffs.
type choice struct {
	Decode, Prefill string
	Local           bool
	Hit             int
}

func summarise(d Decision) choice {
	return choice{Decode: d.Decode.ID, Prefill: d.Prefill.ID, Local: d.Local, Hit: d.PrefixHitTokens}
}

func TestRoute(t *testing.T) {
	req := Request{ID: "r", PromptTokens: 100, MaxTokens: 28}
	tests := []struct {
		name    string
		cfg     Config
		req     Request
		decode  []Worker
		prefill []Worker
		exclude map[string]bool
		want    choice
		wantErr error
	}{
		{
			name:    "most free blocks wins",
			decode:  []Worker{{ID: "d0", KVBlocksFree: 10}, {ID: "d1", KVBlocksFree: 30}, {ID: "d2", KVBlocksFree: 20}},
			prefill: []Worker{{ID: "p0"}},
			want:    choice{Decode: "d1", Prefill: "p0"},
		},
		{
			name:    "tie on free blocks: least running batch",
			decode:  []Worker{{ID: "d0", KVBlocksFree: 30, RunningBatch: 4}, {ID: "d1", KVBlocksFree: 30, RunningBatch: 2}},
			prefill: []Worker{{ID: "p0"}},
			want:    choice{Decode: "d1", Prefill: "p0"},
		},
		{
			name:    "full tie: lowest id",
			decode:  []Worker{{ID: "d1", KVBlocksFree: 30}, {ID: "d0", KVBlocksFree: 30}},
			prefill: []Worker{{ID: "p1"}, {ID: "p0"}},
			want:    choice{Decode: "d0", Prefill: "p0"},
		},
		{
			name:    "draining and excluded decode workers are skipped",
			decode:  []Worker{{ID: "d0", KVBlocksFree: 90, Draining: true}, {ID: "d1", KVBlocksFree: 80}, {ID: "d2", KVBlocksFree: 10}},
			prefill: []Worker{{ID: "p0"}},
			exclude: map[string]bool{"d1": true},
			want:    choice{Decode: "d2", Prefill: "p0"},
		},
		{
			name:    "no decode worker",
			decode:  []Worker{{ID: "d0", Draining: true}},
			prefill: []Worker{{ID: "p0"}},
			wantErr: ErrNoDecodeWorkers,
		},
		{
			name:    "decode only ignores missing prefill workers",
			req:     Request{ID: "r", PromptTokens: 100, DecodeOnly: true},
			decode:  []Worker{{ID: "d0", KVBlocksFree: 10}},
			prefill: nil,
			want:    choice{Decode: "d0"},
		},
		{
			name:    "fewest queued prefill tokens",
			decode:  []Worker{{ID: "d0", KVBlocksFree: 10}},
			prefill: []Worker{{ID: "p0", QueuedPrefillTokens: 500}, {ID: "p1", QueuedPrefillTokens: 100}, {ID: "p2", QueuedPrefillTokens: 300}},
			want:    choice{Decode: "d0", Prefill: "p1"},
		},
		{
			name:    "no prefill worker in disaggregated mode",
			decode:  []Worker{{ID: "d0", KVBlocksFree: 10}},
			prefill: []Worker{{ID: "p0", Draining: true}},
			wantErr: ErrNoPrefillWorkers,
		},
		{
			name:    "all prefill queues full",
			cfg:     Config{MaxQueuedPrefillTokens: 1000},
			decode:  []Worker{{ID: "d0", KVBlocksFree: 10}},
			prefill: []Worker{{ID: "p0", QueuedPrefillTokens: 1000}, {ID: "p1", QueuedPrefillTokens: 2000}},
			wantErr: ErrNoCapacity,
		},
		{
			name:    "full prefill queue skipped",
			cfg:     Config{MaxQueuedPrefillTokens: 1000},
			decode:  []Worker{{ID: "d0", KVBlocksFree: 10}},
			prefill: []Worker{{ID: "p0", QueuedPrefillTokens: 1000}, {ID: "p1", QueuedPrefillTokens: 999}},
			want:    choice{Decode: "d0", Prefill: "p1"},
		},
		{
			name:   "colocated: always local, prefill list ignored",
			cfg:    Config{Colocated: true},
			decode: []Worker{{ID: "c0", KVBlocksFree: 10}, {ID: "c1", KVBlocksFree: 20}},
			want:   choice{Decode: "c1", Local: true},
		},
		{
			name:    "short prompt prefills locally",
			cfg:     Config{LocalPrefillBelowTokens: 101},
			decode:  []Worker{{ID: "d0", KVBlocksFree: 10}},
			prefill: []Worker{{ID: "p0"}},
			want:    choice{Decode: "d0", Local: true},
		},
		{
			name:    "prompt at the threshold goes remote",
			cfg:     Config{LocalPrefillBelowTokens: 100},
			decode:  []Worker{{ID: "d0", KVBlocksFree: 10}},
			prefill: []Worker{{ID: "p0"}},
			want:    choice{Decode: "d0", Prefill: "p0"},
		},
		{
			name: "cached prefix on the decode worker makes the prompt short",
			cfg:  Config{LocalPrefillBelowTokens: 50, BlockTokens: 16},
			req:  Request{ID: "r", PromptTokens: 100, PrefixHashes: []uint64{1, 2, 3, 4, 5, 6}},
			// 4 blocks cached = 64 tokens; 36 uncached < 50.
			decode:  []Worker{{ID: "d0", KVBlocksFree: 10, PrefixDigest: []uint64{4, 3, 2, 1, 9}}},
			prefill: []Worker{{ID: "p0"}},
			want:    choice{Decode: "d0", Local: true, Hit: 64},
		},
		{
			name: "prefix overlap outweighs a longer queue",
			cfg:  Config{Prefill: Weights{Queue: 1, Prefix: 1}, BlockTokens: 16},
			req:  Request{ID: "r", PromptTokens: 100, PrefixHashes: []uint64{1, 2, 3, 4, 5, 6}},
			// Queue scores 1 − q/80: p0 .375, p1 0, p2 .125; prefix scores
			// (blocks held of 6): p0 0, p1 3/6 = .5, p2 chain broken after
			// block 1: 1/6. Totals: p0 .375, p1 .5, p2 .29.
			decode: []Worker{{ID: "d0", KVBlocksFree: 10}},
			prefill: []Worker{
				{ID: "p0", QueuedPrefillTokens: 50},
				{ID: "p1", QueuedPrefillTokens: 80, PrefixDigest: []uint64{1, 2, 3}},
				{ID: "p2", QueuedPrefillTokens: 70, PrefixDigest: []uint64{1, 3, 4}},
			},
			want: choice{Decode: "d0", Prefill: "p1", Hit: 48},
		},
		{
			// Default weights: p1 holds the whole prompt (prefix score 1)
			// but has the longest queue (queue score 0); p0 queue 1 −
			// 50/80 = .375, no prefix.
			name:    "default weights follow the prefix",
			cfg:     Config{BlockTokens: 16},
			req:     Request{ID: "r", PromptTokens: 48, PrefixHashes: []uint64{1, 2, 3}},
			decode:  []Worker{{ID: "d0", KVBlocksFree: 10}},
			prefill: []Worker{{ID: "p0", QueuedPrefillTokens: 50}, {ID: "p1", QueuedPrefillTokens: 80, PrefixDigest: []uint64{1, 2, 3}}},
			want:    choice{Decode: "d0", Prefill: "p1", Hit: 48},
		},
		{
			// p1's index holds blocks 1-3 (its digest lists none); p2's
			// digest lists them, but its index, which replaces the
			// digest, holds none.
			name:   "the prefix index replaces the digest",
			cfg:    Config{BlockTokens: 16},
			req:    Request{ID: "r", PromptTokens: 48, PrefixHashes: []uint64{1, 2, 3}},
			decode: []Worker{{ID: "d0", KVBlocksFree: 10}},
			prefill: []Worker{
				{ID: "p0", QueuedPrefillTokens: 50},
				{ID: "p1", QueuedPrefillTokens: 80, Prefix: heldBlocks{1: true, 2: true, 3: true}},
				{ID: "p2", QueuedPrefillTokens: 60, PrefixDigest: []uint64{1, 2, 3}, Prefix: heldBlocks{}},
			},
			want: choice{Decode: "d0", Prefill: "p1", Hit: 48},
		},
		{
			// Equal queues: p1 holds the prefix in engine memory (score
			// 1), p2 in its host tier (1 − 0.08), p0 nowhere.
			name:   "engine memory beats the host tier, which beats recomputing",
			cfg:    Config{BlockTokens: 16},
			req:    Request{ID: "r", PromptTokens: 48, PrefixHashes: []uint64{1, 2, 3}},
			decode: []Worker{{ID: "d0", KVBlocksFree: 10}},
			prefill: []Worker{
				{ID: "p0", QueuedPrefillTokens: 50, Prefix: heldBlocks{}},
				{ID: "p1", QueuedPrefillTokens: 50, Prefix: heldBlocks{1: true, 2: true, 3: true}},
				{ID: "p2", QueuedPrefillTokens: 50, Prefix: heldBlocks{}, HostPrefix: heldBlocks{1: true, 2: true, 3: true}},
			},
			want: choice{Decode: "d0", Prefill: "p1", Hit: 48},
		},
		{
			// p1 holds one block in engine memory; p2 all three in its
			// host tier: 1/3 against 1 − 3 × 0.08 / 3 = 0.92. The hit is
			// what p2 loads.
			name:   "a deeper host-tier prefix beats a shallow engine one",
			cfg:    Config{BlockTokens: 16},
			req:    Request{ID: "r", PromptTokens: 60, PrefixHashes: []uint64{1, 2, 3}},
			decode: []Worker{{ID: "d0", KVBlocksFree: 10}},
			prefill: []Worker{
				{ID: "p1", QueuedPrefillTokens: 50, Prefix: heldBlocks{1: true}},
				{ID: "p2", QueuedPrefillTokens: 50, Prefix: heldBlocks{}, HostPrefix: heldBlocks{1: true, 2: true, 3: true}},
			},
			want: choice{Decode: "d0", Prefill: "p2", Hit: 48},
		},
		{
			// Equal queues: p2 holds the prefix in its host tier (1 −
			// 0.08), p1 on its disk tier (1 − 0.85), p0 nowhere.
			name:   "the host tier beats the disk tier",
			cfg:    Config{BlockTokens: 16},
			req:    Request{ID: "r", PromptTokens: 48, PrefixHashes: []uint64{1, 2, 3}},
			decode: []Worker{{ID: "d0", KVBlocksFree: 10}},
			prefill: []Worker{
				{ID: "p0", QueuedPrefillTokens: 50, Prefix: heldBlocks{}},
				{ID: "p1", QueuedPrefillTokens: 50, Prefix: heldBlocks{}, DiskPrefix: heldBlocks{1: true, 2: true, 3: true}},
				{ID: "p2", QueuedPrefillTokens: 50, Prefix: heldBlocks{}, HostPrefix: heldBlocks{1: true, 2: true, 3: true}},
			},
			want: choice{Decode: "d0", Prefill: "p2", Hit: 48},
		},
		{
			// p1 reads all three blocks from disk: 4 × (1 − 0.85) = 0.6
			// against p0's queue lead 1 − 50/60 = 0.17. The hit is what
			// p1 reads.
			name:   "the disk tier beats recomputing",
			cfg:    Config{BlockTokens: 16},
			req:    Request{ID: "r", PromptTokens: 60, PrefixHashes: []uint64{1, 2, 3}},
			decode: []Worker{{ID: "d0", KVBlocksFree: 10}},
			prefill: []Worker{
				{ID: "p0", QueuedPrefillTokens: 50, Prefix: heldBlocks{}},
				{ID: "p1", QueuedPrefillTokens: 60, Prefix: heldBlocks{}, DiskPrefix: heldBlocks{1: true, 2: true, 3: true}},
			},
			want: choice{Decode: "d0", Prefill: "p1", Hit: 48},
		},
		{
			name:    "least-loaded ignores the prefix",
			cfg:     Config{Decode: LeastLoadedDecodeWeights, Prefill: LeastLoadedPrefillWeights, BlockTokens: 16},
			req:     Request{ID: "r", PromptTokens: 48, PrefixHashes: []uint64{1, 2, 3}},
			decode:  []Worker{{ID: "d0", KVBlocksFree: 10}},
			prefill: []Worker{{ID: "p0", QueuedPrefillTokens: 50}, {ID: "p1", QueuedPrefillTokens: 80, PrefixDigest: []uint64{1, 2, 3}}},
			want:    choice{Decode: "d0", Prefill: "p0"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := New(tc.cfg)
			rq := req
			if tc.req.ID != "" {
				rq = tc.req
			}
			d, err := r.Route(at(0), rq, tc.decode, tc.prefill, tc.exclude)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Route error = %v, want %v", err, tc.wantErr)
				}
				if r.InFlight() != 0 {
					t.Errorf("failed Route left %d assignments", r.InFlight())
				}
				return
			}
			if err != nil {
				t.Fatalf("Route: %v", err)
			}
			if diff := cmp.Diff(tc.want, summarise(d)); diff != "" {
				t.Errorf("Route (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDefaultFollowsSharedPrefix: with the default config, a follow-up
// whose prompt shares a prefix with the first request goes to the prefill
// worker that prefilled it, although that worker is the busier one (its
// queue holds a third request's prompt): prefix 40/44 of the blocks ×
// weight 4 = 3.6 against the idle worker's queue score 1 (the busy one's
// is 0). Least-loaded sends it to the idle one and recomputes the prefix.
// The decode profile likewise prefers the decode worker holding the
// prefix (0.91 against a lead of 0.1 in free KV share).
func TestDefaultFollowsSharedPrefix(t *testing.T) {
	const bt = 16
	// 40 shared blocks, then 4 blocks of its own per turn.
	shared := make([]uint64, 40)
	for i := range shared {
		shared[i] = uint64(100 + i)
	}
	turn := func(k uint64) []uint64 {
		return append(append([]uint64{}, shared...), 1000*k+1, 1000*k+2, 1000*k+3, 1000*k+4)
	}
	for _, tc := range []struct {
		name        string
		cfg         Config
		wantPrefill string
		wantDecode  string
		wantHit     int
	}{
		{"default", Config{BlockTokens: bt}, "p0", "d0", 40 * bt},
		{"least-loaded", Config{BlockTokens: bt, Decode: LeastLoadedDecodeWeights, Prefill: LeastLoadedPrefillWeights}, "p1", "d1", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New(tc.cfg)
			decode := []Worker{{ID: "d0", KVBlocksFree: 1000, Time: at(0)}, {ID: "d1", KVBlocksFree: 1000, Time: at(0)}}
			prefill := []Worker{{ID: "p0", Time: at(0)}, {ID: "p1", Time: at(0)}}
			// Turn 1 on idle workers: the lowest ids.
			first, err := r.Route(at(1), Request{ID: "t1", PromptTokens: 44 * bt, PrefixHashes: turn(1)}, decode, prefill, nil)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(choice{Decode: "d0", Prefill: "p0"}, summarise(first)); diff != "" {
				t.Fatalf("turn 1 (-want +got):\n%s", diff)
			}
			r.Done("t1")
			// Heartbeats after turn 1: p0 and d0 hold its blocks; p0
			// has another prompt of 200 tokens queued, d0 runs it
			// with 100 fewer free blocks.
			decode = []Worker{
				{ID: "d0", KVBlocksFree: 900, RunningBatch: 1, Time: at(10), PrefixDigest: turn(1)},
				{ID: "d1", KVBlocksFree: 1000, Time: at(10)},
			}
			prefill = []Worker{
				{ID: "p0", QueuedPrefillTokens: 200, Time: at(10), PrefixDigest: turn(1)},
				{ID: "p1", Time: at(10)},
			}
			d, err := r.Route(at(11), Request{ID: "t2", PromptTokens: 44 * bt, PrefixHashes: turn(2)}, decode, prefill, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := choice{Decode: tc.wantDecode, Prefill: tc.wantPrefill, Hit: tc.wantHit}
			if diff := cmp.Diff(want, summarise(d)); diff != "" {
				t.Errorf("turn 2 (-want +got):\n%s", diff)
			}
		})
	}
}

// A burst between two heartbeats spreads over equal workers, and an
// assignment stops counting once a newer snapshot reflects it.
func TestRouteBurstSpreads(t *testing.T) {
	r := New(Config{BlockTokens: 16})
	decode := []Worker{
		{ID: "d0", KVBlocksFree: 100, Time: at(0)},
		{ID: "d1", KVBlocksFree: 100, Time: at(0)},
	}
	prefill := []Worker{
		{ID: "p0", Time: at(0)},
		{ID: "p1", Time: at(0)},
	}
	var got []choice
	for i, id := range []string{"a", "b", "c", "d"} {
		// 32 prompt + 0 output tokens = 2 blocks each.
		d, err := r.Route(at(10+i), Request{ID: id, PromptTokens: 32}, decode, prefill, nil)
		if err != nil {
			t.Fatalf("Route %s: %v", id, err)
		}
		got = append(got, summarise(d))
	}
	want := []choice{
		{Decode: "d0", Prefill: "p0"},
		{Decode: "d1", Prefill: "p1"},
		{Decode: "d0", Prefill: "p0"},
		{Decode: "d1", Prefill: "p1"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("burst (-want +got):\n%s", diff)
	}

	// New snapshots taken after the burst: d0 reports the 4 blocks of
	// a and c, d1 still reports 100 free (its requests finished). Only the
	// snapshot counts now, so d1 wins despite its two recorded assignments.
	decode = []Worker{
		{ID: "d0", KVBlocksFree: 96, Time: at(20)},
		{ID: "d1", KVBlocksFree: 100, Time: at(20)},
	}
	d, err := r.Route(at(21), Request{ID: "e", PromptTokens: 32}, decode, prefill, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.Decode.ID != "d1" {
		t.Errorf("after fresh snapshots: decode %s, want d1", d.Decode.ID)
	}
}

func TestDoneAndPrefillDone(t *testing.T) {
	r := New(Config{})
	decode := []Worker{{ID: "d0", KVBlocksFree: 10}, {ID: "d1", KVBlocksFree: 10}}
	prefill := []Worker{{ID: "p0"}, {ID: "p1"}}
	if _, err := r.Route(at(1), Request{ID: "a", PromptTokens: 64}, decode, prefill, nil); err != nil {
		t.Fatal(err)
	}
	// a holds d0 and p0; after PrefillDone p0 is free again but d0 is not.
	r.PrefillDone("a")
	d, err := r.Route(at(2), Request{ID: "b", PromptTokens: 64}, decode, prefill, nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(choice{Decode: "d1", Prefill: "p0"}, summarise(d)); diff != "" {
		t.Errorf("after PrefillDone (-want +got):\n%s", diff)
	}
	r.Done("a")
	r.Done("b")
	r.Done("unknown")
	if n := r.InFlight(); n != 0 {
		t.Errorf("InFlight after Done = %d, want 0", n)
	}
	// Routing the same id again replaces the assignment.
	for range 3 {
		if _, err := r.Route(at(3), Request{ID: "c", PromptTokens: 1}, decode, prefill, nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.InFlight(); n != 1 {
		t.Errorf("InFlight after re-routing one id = %d, want 1", n)
	}
}

// BenchmarkRoute routes over 16 decode and 16 prefill workers with 256
// assignments in flight.
func BenchmarkRoute(b *testing.B) {
	r := New(Config{Prefill: Weights{Queue: 1, Prefix: 1}})
	var decode, prefill []Worker
	for i := range 16 {
		decode = append(decode, Worker{ID: fmt.Sprintf("d%02d", i), KVBlocksFree: 1000 + i, Time: at(0)})
		prefill = append(prefill, Worker{ID: fmt.Sprintf("p%02d", i), QueuedPrefillTokens: 100 * i, PrefixDigest: []uint64{1, 2, 3}, Time: at(0)})
	}
	for i := range 256 {
		if _, err := r.Route(at(1), Request{ID: fmt.Sprint("warm", i), PromptTokens: 512, MaxTokens: 128}, decode, prefill, nil); err != nil {
			b.Fatal(err)
		}
	}
	req := Request{ID: "x", PromptTokens: 512, MaxTokens: 128, PrefixHashes: []uint64{1, 2, 3, 4}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Route(at(2), req, decode, prefill, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func TestRouteServesTheRequestedModel(t *testing.T) {
	decode := []Worker{
		{ID: "d-a", Addr: "a", KVBlocksFree: 100, KVBlocksTotal: 100, Model: "alpha"},
		{ID: "d-b", Addr: "b", KVBlocksFree: 1000, KVBlocksTotal: 1000, Model: "beta"},
	}
	prefill := []Worker{
		{ID: "p-a", Addr: "pa", Model: "alpha"},
		{ID: "p-b", Addr: "pb", Model: "beta"},
	}
	for _, model := range []string{"alpha", "beta"} {
		t.Run(model, func(t *testing.T) {
			r := New(Config{})
			for i := range 5 {
				dec, err := r.Route(time.Unix(0, 0), Request{ID: fmt.Sprint(model, i), PromptTokens: 10, MaxTokens: 4, Model: model}, decode, prefill, nil)
				if err != nil {
					t.Fatal(err)
				}
				want := map[string]string{"alpha": "-a", "beta": "-b"}[model]
				if !strings.HasSuffix(dec.Decode.ID, want) || !strings.HasSuffix(dec.Prefill.ID, want) {
					t.Fatalf("model %s routed to %s and %s", model, dec.Prefill.ID, dec.Decode.ID)
				}
			}
		})
	}
	if _, err := New(Config{}).Route(time.Unix(0, 0), Request{ID: "x", PromptTokens: 1, Model: "gamma"}, decode, prefill, nil); !errors.Is(err, ErrNoDecodeWorkers) {
		t.Fatalf("unserved model: err %v, want ErrNoDecodeWorkers", err)
	}
}

func TestRouteLocalForcesLocalPrefill(t *testing.T) {
	decode := []Worker{{ID: "d", Addr: "d", KVBlocksFree: 10, KVBlocksTotal: 10}}
	dec, err := New(Config{}).Route(time.Unix(0, 0), Request{ID: "x", PromptTokens: 5000, Local: true}, decode, nil, nil)
	if err != nil || !dec.Local || dec.Prefill.ID != "" {
		t.Fatalf("Local request: decision %+v, err %v; want local prefill on d", dec, err)
	}
}

// TestRouteRoundRobin: Config.Picker roundrobin takes the workers of each
// profile in turn by id, whatever the scores say (d1 has far more free KV).
func TestRouteRoundRobin(t *testing.T) {
	r := New(Config{BlockTokens: 16, Picker: PickerRoundRobin})
	decode := []Worker{
		{ID: "d1", KVBlocksFree: 1000, Time: at(0)},
		{ID: "d0", KVBlocksFree: 100, Time: at(0)},
	}
	prefill := []Worker{{ID: "p2", Time: at(0)}, {ID: "p0", Time: at(0)}, {ID: "p1", Time: at(0)}}
	var got []choice
	for i, id := range []string{"a", "b", "c", "d"} {
		d, err := r.Route(at(10+i), Request{ID: id, PromptTokens: 32}, decode, prefill, nil)
		if err != nil {
			t.Fatalf("Route %s: %v", id, err)
		}
		got = append(got, summarise(d))
	}
	want := []choice{
		{Decode: "d0", Prefill: "p0"},
		{Decode: "d1", Prefill: "p1"},
		{Decode: "d0", Prefill: "p2"},
		{Decode: "d1", Prefill: "p0"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("round robin (-want +got):\n%s", diff)
	}
}

func TestNewUnknownPickerPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("New with an unknown picker did not panic")
		}
	}()
	New(Config{Picker: "random"})
}

// TestFullBatchLosesThePrefix: a decode worker holding the prompt's whole
// prefix wins while its batch has room, and stops winning once its batch
// (the heartbeat's plus the router's own assignments) reaches its
// max_batch, so that the next request takes the other worker's free slot
// instead of waiting for one.
func TestFullBatchLosesThePrefix(t *testing.T) {
	hashes := []uint64{1, 2, 3, 4}
	r := New(Config{BlockTokens: 16})
	decode := []Worker{
		{ID: "d0", KVBlocksFree: 900, KVBlocksTotal: 1000, RunningBatch: 2, MaxBatch: 4, Time: at(0), PrefixDigest: hashes},
		{ID: "d1", KVBlocksFree: 1000, KVBlocksTotal: 1000, MaxBatch: 4, Time: at(0)},
	}
	prefill := []Worker{{ID: "p0", Time: at(0)}}
	var got []string
	for i, id := range []string{"a", "b", "c"} {
		d, err := r.Route(at(1+i), Request{ID: id, PromptTokens: 64, MaxTokens: 16, PrefixHashes: hashes}, decode, prefill, nil)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, d.Decode.ID)
	}
	// a and b fill d0's two free slots; c finds it full.
	if diff := cmp.Diff([]string{"d0", "d0", "d1"}, got); diff != "" {
		t.Errorf("decode workers (-want +got):\n%s", diff)
	}
}

// TestReviseRevisitsRemote: a prompt routed remote on a stale digest (the
// decode worker seemed to hold nothing) turns local when the decode
// worker's Reserve answers a hit that leaves fewer uncached tokens than
// LocalPrefillBelowTokens; its prefill worker's queue no longer counts it.
// A hit that leaves too many stays remote; a local decision is not
// revised, and Revised counts a request once and ignores unknown ids.
func TestReviseRevisitsRemote(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := New(Config{BlockTokens: 16, LocalPrefillBelowTokens: 64, Registerer: reg})
	decode := []Worker{{ID: "d0", KVBlocksFree: 100, Time: at(0)}}
	prefill := []Worker{{ID: "p0", Time: at(0)}, {ID: "p1", Time: at(0)}}
	decs := map[string]Decision{}
	for _, id := range []string{"a", "b"} {
		d, err := r.Route(at(1), Request{ID: id, PromptTokens: 512}, decode, prefill, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d.Local {
			t.Fatalf("%s: routed local, want remote (no hit known)", id)
		}
		decs[id] = d
	}
	if _, local := Revise(decs["a"], 512, 512-100); local {
		t.Error("Revise(a, 100 uncached): local, want remote (64 is the threshold)")
	}
	b, local := Revise(decs["b"], 512, 512-63)
	if !local || !b.Local || b.Prefill.ID != "" || b.Decode.ID != "d0" || b.PrefixHitTokens != 0 {
		t.Errorf("Revise(b, 63 uncached) = %+v, %t; want local on d0, no prefill worker, no predicted hit", b, local)
	}
	r.Revised("b")
	if _, again := Revise(b, 512, 512); again {
		t.Error("Revise of a decision already local: revised again")
	}
	r.Revised("b")       // already dropped: not counted twice
	r.Revised("unknown") // ignored
	// b's 512 tokens no longer count on its prefill worker: the next
	// prompt goes where a's queue is not, by the queue scorer.
	loads := r.loads(decode, prefill)
	if got := loads["p0"].QueuedPrefillTokens + loads["p1"].QueuedPrefillTokens; got != 512 {
		t.Errorf("queued prefill tokens after b turned local: %d, want 512 (a only)", got)
	}
	want := `
# HELP pdserve_router_decisions_total Requests routed, by where their prompt prefills: remote, local_short (few uncached tokens), local_busy (prefill pool busy), local_reserved (few uncached tokens by the decode worker's Reserve, routed remote on the estimate), local (colocated or required), decode_only (recovery).
# TYPE pdserve_router_decisions_total counter
pdserve_router_decisions_total{placement="local_reserved"} 1
pdserve_router_decisions_total{placement="remote"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pdserve_router_decisions_total"); err != nil {
		t.Error(err)
	}
}

// heldBlocks is a PrefixMatcher holding the hashes set true.
type heldBlocks map[uint64]bool

func (h heldBlocks) Match(hashes []uint64) int {
	n := 0
	for n < len(hashes) && h[hashes[n]] {
		n++
	}
	return n
}

// TestPrefixIndexBeyondDigest: a prompt whose blocks lie past the 4096 a
// heartbeat digest carries is matched in full through Worker.Prefix.
func TestPrefixIndexBeyondDigest(t *testing.T) {
	const blocks = 5001
	hs := make([]uint64, blocks)
	held := heldBlocks{}
	for i := range hs {
		hs[i] = uint64(i + 1)
		held[hs[i]] = true
	}
	r := New(Config{BlockTokens: 16})
	req := Request{ID: "r", PromptTokens: blocks*16 + 1, PrefixHashes: hs}
	d, err := r.Route(at(0), req, []Worker{{ID: "d0", KVBlocksFree: 1 << 20}},
		[]Worker{{ID: "p0"}, {ID: "p1", Prefix: held}, {ID: "p2", PrefixDigest: hs[:4096]}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.Prefill.ID != "p1" || d.PrefixHitTokens != blocks*16 {
		t.Errorf("routed to %s with a %d-token hit; want p1 with all %d blocks (%d tokens)", d.Prefill.ID, d.PrefixHitTokens, blocks, blocks*16)
	}
}

// TestRoutePullsFromPeer: a prefill worker that pulls prefixes from
// peers is credited with the deepest prefix any other worker holds, in
// any tier and any role, at its pull cost, so a busy holder loses the
// prompt to an idle worker that pulls; one that does not pull is not.
func TestRoutePullsFromPeer(t *testing.T) {
	hs := make([]uint64, 10)
	held := heldBlocks{}
	for i := range hs {
		hs[i] = uint64(i + 1)
		held[hs[i]] = true
	}
	req := Request{ID: "r", PromptTokens: 170, PrefixHashes: hs}
	decode := []Worker{{ID: "d0", KVBlocksFree: 1 << 10}}
	for _, tc := range []struct {
		name     string
		decode   []Worker
		prefill  []Worker
		want     string
		wantHits int
	}{
		{"the busy holder keeps it from a worker that does not pull", decode,
			[]Worker{{ID: "p0", Prefix: held, QueuedPrefillTokens: 10000}, {ID: "p1"}}, "p0", 160},
		{"an idle worker that pulls takes it from the busy holder", decode,
			[]Worker{{ID: "p0", Prefix: held, QueuedPrefillTokens: 10000}, {ID: "p1", PeerPullCost: 0.2}}, "p1", 160},
		{"from the holder's host tier too", decode,
			[]Worker{{ID: "p0", HostPrefix: held, QueuedPrefillTokens: 10000}, {ID: "p1", PeerPullCost: 0.2}}, "p1", 160},
		{"a pull slower than computing is not credited", decode,
			[]Worker{{ID: "p0", Prefix: held, QueuedPrefillTokens: 10000}, {ID: "p1", PeerPullCost: 1.5}}, "p0", 160},
		{"from a decode worker's cache", []Worker{{ID: "d0", KVBlocksFree: 1 << 10, DiskPrefix: held}},
			[]Worker{{ID: "p0"}, {ID: "p1", PeerPullCost: 0.2}}, "p1", 160},
		{"the holder is not its own peer", decode,
			[]Worker{{ID: "p0", Prefix: heldBlocks{1: true, 2: true}, PeerPullCost: 0.2}, {ID: "p1", PeerPullCost: 0.2}}, "p0", 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New(Config{BlockTokens: 16})
			d, err := r.Route(at(0), req, tc.decode, tc.prefill, nil)
			if err != nil {
				t.Fatal(err)
			}
			if d.Prefill.ID != tc.want || d.PrefixHitTokens != tc.wantHits {
				t.Errorf("routed to %q with a %d-token hit; want %q with %d", d.Prefill.ID, d.PrefixHitTokens, tc.want, tc.wantHits)
			}
		})
	}
}

// TestDecisionPeer: the decision names the pull of the worker that
// prefills (the prefill worker, or the decode worker when local): from
// the deepest other holder of the prompt's prefix in any tier, among
// Request.Peers when given (any role), only when it holds more than the
// puller and has an address. LocalPeer is the decode worker's, which
// Revise puts in Peer.
func TestDecisionPeer(t *testing.T) {
	hs := make([]uint64, 10)
	held, two := heldBlocks{}, heldBlocks{1: true, 2: true}
	for i := range hs {
		hs[i] = uint64(i + 1)
		held[hs[i]] = true
	}
	d0 := Worker{ID: "d0", Addr: "d0:1", KVBlocksFree: 1 << 10, Prefix: two}
	p0 := Worker{ID: "p0", Addr: "p0:1"}
	c0 := Worker{ID: "c0", Addr: "c0:1", HostPrefix: held} // a colocated worker: a peer, never a candidate here
	type pulls struct{ Peer, PeerTokens, Local, LocalTokens any }
	for _, tc := range []struct {
		name  string
		req   Request
		peers []Worker
		want  pulls
	}{
		{"remote: the prefill worker pulls from the deepest, the decode worker's pull is kept",
			Request{}, []Worker{d0, p0, c0}, pulls{"c0", 160, "c0", 160}},
		{"without Peers the lists are the peers: the decode worker holds more than the prefill worker",
			Request{}, nil, pulls{"d0", 32, "", 0}},
		{"local: the decode worker's pull is the peer",
			Request{Local: true}, []Worker{d0, p0, c0}, pulls{"c0", 160, "c0", 160}},
		{"a holder without an address is no peer",
			Request{}, []Worker{d0, p0, {ID: "c0", HostPrefix: held}}, pulls{"", 0, "", 0}},
		{"decode only: the decode worker's pull",
			Request{DecodeOnly: true}, []Worker{d0, p0, c0}, pulls{"c0", 160, "c0", 160}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			req.ID, req.PromptTokens, req.PrefixHashes, req.Peers = "r", 170, hs, tc.peers
			d, err := New(Config{BlockTokens: 16}).Route(at(0), req, []Worker{d0}, []Worker{p0}, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := pulls{d.Peer.From.ID, d.Peer.Tokens, d.LocalPeer.From.ID, d.LocalPeer.Tokens}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("pulls (-want +got):\n%s", diff)
			}
		})
	}
	// Revise moves the decode worker's pull into Peer.
	d, err := New(Config{BlockTokens: 16, LocalPrefillBelowTokens: 64}).Route(at(0),
		Request{ID: "r", PromptTokens: 170, PrefixHashes: hs, Peers: []Worker{d0, p0, c0}}, []Worker{d0}, []Worker{p0}, nil)
	if err != nil || d.Local {
		t.Fatalf("Route = %+v, %v; want remote", d, err)
	}
	if l, ok := Revise(d, 170, 160); !ok || l.Peer.From.ID != "c0" || l.Peer.Tokens != d.LocalPeer.Tokens {
		t.Errorf("Revise on a 160-token hit: %+v, %t; want local with the decode worker's pull", l.Peer, ok)
	}
}

// A request that ended leaves its prompt with its workers: the next
// request built on it goes to them although no KV event or digest says
// so yet, for recentTTL, and not to a worker that left (Retain).
func TestRecentPrompts(t *testing.T) {
	r := New(Config{RecentTTL: DefaultRecentTTL})
	prompt := []uint64{11, 12, 13, 14}
	turn2 := append(append([]uint64(nil), prompt...), 15, 16)
	// Equal workers: d1 and p1 only by excluding d0/p0 the first time.
	decode := []Worker{{ID: "d0", KVBlocksFree: 100, Time: at(0)}, {ID: "d1", KVBlocksFree: 100, Time: at(0)}}
	prefill := []Worker{{ID: "p0", Time: at(0)}, {ID: "p1", Time: at(0)}}
	route := func(ms int, id string, hashes []uint64, exclude map[string]bool) choice {
		t.Helper()
		d, err := r.Route(at(ms), Request{ID: id, PromptTokens: 16 * len(hashes), MaxTokens: 8, PrefixHashes: hashes}, decode, prefill, exclude)
		if err != nil {
			t.Fatal(err)
		}
		return summarise(d)
	}
	first, err := r.Route(at(0), Request{ID: "t1", PromptTokens: 64, MaxTokens: 8, PrefixHashes: prompt}, decode,
		[]Worker{{ID: "p1", Time: at(0)}}, map[string]bool{"d0": true})
	if err != nil || first.Decode.ID != "d1" || first.Prefill.ID != "p1" {
		t.Fatalf("first turn: %+v, %v", summarise(first), err)
	}
	// In flight: no claim yet (its KV is not stored until it ends).
	if got := route(10, "x", turn2, nil); got.Decode != "d0" || got.Hit != 0 {
		t.Errorf("while the first turn runs: %+v, want d0 and no hit", got)
	}
	r.Done("t1")
	if got := route(100, "t2", turn2, nil); got.Decode != "d1" || got.Prefill != "p1" || got.Hit != 64 {
		t.Errorf("next turn: %+v, want d1 and p1 with the first turn's 64 tokens", got)
	}
	r.Done("t2")
	r.Done("x")
	if got := route(100+int(DefaultRecentTTL/time.Millisecond)+1, "late", []uint64{11, 12, 99}, nil); got.Hit != 0 {
		t.Errorf("after recentTTL: %+v, want no hit", got)
	}
	r.Done("late")
	r.Retain(map[string]bool{"d0": true, "p0": true})
	if len(r.recent["d1"])+len(r.recent["p1"]) != 0 || len(r.recent["d0"]) == 0 {
		t.Errorf("after d1 and p1 left, remembered: %v", r.recent)
	}
	off := New(Config{})
	if _, err := off.Route(at(0), Request{ID: "t1", PromptTokens: 64, MaxTokens: 8, PrefixHashes: prompt}, decode, prefill, map[string]bool{"d0": true}); err != nil {
		t.Fatal(err)
	}
	off.Done("t1")
	if d, err := off.Route(at(100), Request{ID: "t2", PromptTokens: 96, MaxTokens: 8, PrefixHashes: turn2}, decode, prefill, nil); err != nil || d.Decode.ID != "d0" || d.PrefixHitTokens != 0 {
		t.Errorf("RecentTTL 0: %+v, %v; want d0 and no hit", summarise(d), err)
	}
}
