package router

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDecider(t *testing.T) {
	d := Decider{LocalPrefillBelowTokens: 100, PrefillQueueLocalTokens: 1000, BusyLocalPrefillBelowTokens: 400}
	tests := []struct {
		name      string
		d         Decider
		uncached  int
		queued    []int
		wantShort bool
		wantBusy  bool
	}{
		{name: "off", d: Decider{}, uncached: 1, queued: []int{1 << 30}},
		{name: "short", d: d, uncached: 99, wantShort: true},
		{name: "at the short threshold", d: d, uncached: 100, queued: []int{0}},
		{name: "fully cached prompt is short", d: d, uncached: 0, wantShort: true},
		{name: "busy pool, fits", d: d, uncached: 399, queued: []int{1000, 5000}, wantBusy: true},
		{name: "busy pool, at the busy threshold", d: d, uncached: 400, queued: []int{1000, 5000}},
		{name: "one prefill worker under the queue threshold", d: d, uncached: 200, queued: []int{999, 5000}},
		{name: "no prefill workers is not busy", d: d, uncached: 200, queued: nil},
		{name: "busy rule off", d: Decider{LocalPrefillBelowTokens: 100}, uncached: 200, queued: []int{1 << 30}},
		{name: "busy rule alone", d: Decider{PrefillQueueLocalTokens: 10, BusyLocalPrefillBelowTokens: 50}, uncached: 49, queued: []int{10}, wantBusy: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.d.Short(tc.uncached); got != tc.wantShort {
				t.Errorf("Short(%d) = %v, want %v", tc.uncached, got, tc.wantShort)
			}
			if got := tc.d.Busy(tc.uncached, tc.queued); got != tc.wantBusy {
				t.Errorf("Busy(%d, %v) = %v, want %v", tc.uncached, tc.queued, got, tc.wantBusy)
			}
		})
	}
}

// The decider inside Route: uncached tokens are the prompt less the
// chosen decode worker's hit, and the pool's load counts this router's
// assignments.
func TestRouteDecides(t *testing.T) {
	busy := Config{BlockTokens: 16, LocalPrefillBelowTokens: 20, PrefillQueueLocalTokens: 1000, BusyLocalPrefillBelowTokens: 200}
	hashes := []uint64{1, 2, 3, 4, 5, 6, 7, 8} // 128 tokens
	cached := []Worker{{ID: "d0", KVBlocksFree: 100, PrefixDigest: []uint64{1, 2, 3, 4, 5, 6, 7, 8}}}
	cold := []Worker{{ID: "d0", KVBlocksFree: 100}}
	tests := []struct {
		name    string
		cfg     Config
		req     Request
		decode  []Worker
		prefill []Worker
		want    choice
		wantErr error
	}{
		{
			name: "long prompt, idle pool: remote",
			cfg:  busy, req: Request{ID: "r", PromptTokens: 300},
			decode: cold, prefill: []Worker{{ID: "p0", QueuedPrefillTokens: 999}},
			want: choice{Decode: "d0", Prefill: "p0"},
		},
		{
			name: "medium prompt, busy pool: local",
			cfg:  busy, req: Request{ID: "r", PromptTokens: 150},
			decode: cold, prefill: []Worker{{ID: "p0", QueuedPrefillTokens: 1000}, {ID: "p1", QueuedPrefillTokens: 4000}},
			want: choice{Decode: "d0", Local: true},
		},
		{
			name: "medium prompt, one prefill worker not busy: remote there",
			cfg:  busy, req: Request{ID: "r", PromptTokens: 150},
			decode: cold, prefill: []Worker{{ID: "p0", QueuedPrefillTokens: 4000}, {ID: "p1", QueuedPrefillTokens: 10}},
			want: choice{Decode: "d0", Prefill: "p1"},
		},
		{
			name: "draining busy workers do not count",
			cfg:  busy, req: Request{ID: "r", PromptTokens: 150},
			decode:  cold,
			prefill: []Worker{{ID: "p0", QueuedPrefillTokens: 4000}, {ID: "p1", Draining: true}},
			want:    choice{Decode: "d0", Local: true},
		},
		{
			name: "cached prefix makes a long prompt short",
			cfg:  busy, req: Request{ID: "r", PromptTokens: 140, PrefixHashes: hashes},
			// 128 cached, 12 uncached < 20.
			decode: cached, prefill: []Worker{{ID: "p0"}},
			want: choice{Decode: "d0", Local: true, Hit: 128},
		},
		{
			name: "cached prefix brings a prompt under the busy threshold",
			cfg:  busy, req: Request{ID: "r", PromptTokens: 300, PrefixHashes: hashes},
			// 172 uncached < 200, pool busy.
			decode: cached, prefill: []Worker{{ID: "p0", QueuedPrefillTokens: 2000}},
			want: choice{Decode: "d0", Local: true, Hit: 128},
		},
		{
			name: "busy rule rescues a full pool",
			cfg: Config{BlockTokens: 16, MaxQueuedPrefillTokens: 1000, PrefillQueueLocalTokens: 1000,
				BusyLocalPrefillBelowTokens: 200},
			req:    Request{ID: "r", PromptTokens: 150},
			decode: cold, prefill: []Worker{{ID: "p0", QueuedPrefillTokens: 1000}},
			want: choice{Decode: "d0", Local: true},
		},
		{
			name: "a long prompt on a full pool: no capacity",
			cfg: Config{BlockTokens: 16, MaxQueuedPrefillTokens: 1000, PrefillQueueLocalTokens: 1000,
				BusyLocalPrefillBelowTokens: 200},
			req:    Request{ID: "r", PromptTokens: 250},
			decode: cold, prefill: []Worker{{ID: "p0", QueuedPrefillTokens: 1000}},
			wantErr: ErrNoCapacity,
		},
		{
			name: "no prefill worker: the busy rule does not apply",
			cfg:  busy, req: Request{ID: "r", PromptTokens: 150},
			decode: cold, prefill: nil,
			wantErr: ErrNoPrefillWorkers,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := New(tc.cfg).Route(at(0), tc.req, tc.decode, tc.prefill, nil)
			if tc.wantErr != nil || err != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Route error = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if diff := cmp.Diff(tc.want, summarise(d)); diff != "" {
				t.Errorf("Route (-want +got):\n%s", diff)
			}
		})
	}

	// The router's own assignments make the pool busy between heartbeats.
	r := New(busy)
	decode, prefill := cold, []Worker{{ID: "p0", QueuedPrefillTokens: 800, Time: at(0)}}
	if d, err := r.Route(at(1), Request{ID: "a", PromptTokens: 300}, decode, prefill, nil); err != nil || d.Local {
		t.Fatalf("first request: %+v, %v; want remote", d, err)
	}
	if d, err := r.Route(at(2), Request{ID: "b", PromptTokens: 150}, decode, prefill, nil); err != nil || !d.Local {
		t.Fatalf("second request (p0 at 800+300 queued): %+v, %v; want local", d, err)
	}
}
