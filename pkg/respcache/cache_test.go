package respcache

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func key(b byte) Key { return Key{b} }

// op is one step of a scenario: a put (size ≥ 0) or a get (size < 0) of
// key k at t0 + at.
type op struct {
	at   time.Duration
	k    byte
	v    string
	size int64
	want string // get: the value expected, "" for a miss
}

func put(at time.Duration, k byte, v string, size int64) op {
	return op{at: at, k: k, v: v, size: size}
}
func get(at time.Duration, k byte, want string) op { return op{at: at, k: k, size: -1, want: want} }

func TestCache(t *testing.T) {
	tests := []struct {
		name  string
		o     Options
		ops   []op
		stats Stats
	}{
		{
			name:  "hit and miss",
			o:     Options{Entries: 2, TTL: time.Minute},
			ops:   []op{get(0, 1, ""), put(0, 1, "a", 1), get(time.Second, 1, "a"), get(time.Second, 2, "")},
			stats: Stats{Entries: 1, Bytes: 1},
		},
		{
			name: "least recently used goes first",
			o:    Options{Entries: 2, TTL: time.Minute},
			ops: []op{
				put(0, 1, "a", 0), put(0, 2, "b", 0),
				get(0, 1, "a"), // 2 is now the least recently used
				put(0, 3, "c", 0),
				get(0, 2, ""), get(0, 1, "a"), get(0, 3, "c"),
			},
			stats: Stats{Entries: 2, Evictions: 1},
		},
		{
			name: "ttl expires at put + ttl",
			o:    Options{Entries: 4, TTL: 10 * time.Minute},
			ops: []op{
				put(0, 1, "a", 3), put(time.Minute, 2, "b", 4),
				get(10*time.Minute-time.Nanosecond, 1, "a"),
				get(10*time.Minute, 1, ""), get(10*time.Minute, 2, "b"),
			},
			stats: Stats{Entries: 1, Bytes: 4, Expirations: 1},
		},
		{
			name:  "a get does not extend the ttl",
			o:     Options{Entries: 4, TTL: time.Minute},
			ops:   []op{put(0, 1, "a", 0), get(59*time.Second, 1, "a"), get(61*time.Second, 1, "")},
			stats: Stats{Expirations: 1},
		},
		{
			name:  "a put renews the entry",
			o:     Options{Entries: 4, TTL: time.Minute},
			ops:   []op{put(0, 1, "a", 5), put(30*time.Second, 1, "a2", 2), get(61*time.Second, 1, "a2"), get(90*time.Second, 1, "")},
			stats: Stats{Expirations: 1},
		},
		{
			name: "byte bound evicts",
			o:    Options{Entries: 10, MaxBytes: 10, TTL: time.Minute},
			ops: []op{
				put(0, 1, "a", 4), put(0, 2, "b", 4), put(0, 3, "c", 4),
				get(0, 1, ""), get(0, 2, "b"), get(0, 3, "c"),
			},
			stats: Stats{Entries: 2, Bytes: 8, Evictions: 1},
		},
		{
			name:  "a value over the byte bound is not stored and drops the old one",
			o:     Options{Entries: 10, MaxBytes: 10, TTL: time.Minute},
			ops:   []op{put(0, 1, "a", 4), put(0, 1, "big", 11), get(0, 1, "")},
			stats: Stats{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New[string](tc.o)
			if err != nil {
				t.Fatal(err)
			}
			for i, o := range tc.ops {
				now := t0.Add(o.at)
				if o.size >= 0 {
					c.Put(now, key(o.k), o.v, o.size)
					continue
				}
				got, ok := c.Get(now, key(o.k))
				if ok != (o.want != "") || got != o.want {
					t.Errorf("op %d: get %d at %v = %q, %v; want %q", i, o.k, o.at, got, ok, o.want)
				}
			}
			if diff := cmp.Diff(tc.stats, c.Stats()); diff != "" {
				t.Errorf("stats (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNewInvalid(t *testing.T) {
	for _, o := range []Options{{Entries: 0, TTL: time.Second}, {Entries: 1}, {Entries: 1, TTL: time.Second, MaxBytes: -1}} {
		if _, err := New[int](o); !errors.Is(err, ErrInvalid) {
			t.Errorf("New(%+v) = %v, want ErrInvalid", o, err)
		}
	}
}

// TestConcurrent runs gets and puts from many goroutines (-race) and
// checks the bounds hold.
func TestConcurrent(t *testing.T) {
	c, err := New[int](Options{Entries: 8, MaxBytes: 64, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				now := t0.Add(time.Duration(i) * time.Second)
				k := key(byte((g + i) % 16))
				if v, ok := c.Get(now, k); ok && v != int(k[0]) {
					t.Errorf("key %d holds %d", k[0], v)
				}
				c.Put(now, k, int(k[0]), int64(i%10))
			}
		})
	}
	wg.Wait()
	if s := c.Stats(); s.Entries > 8 || s.Bytes > 64 || s.Bytes < 0 {
		t.Errorf("stats %+v over the bounds", s)
	}
}
