package planner

import (
	"bytes"
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// blockWorkload is a workload of samples in tokens each, block lists
// given, 16-token blocks, outputs of 8.
func blockWorkload(in int, blocks ...[]int32) *Workload {
	w := &Workload{Description: "blocks", Blocks: blocks, BlockTokens: 16}
	for range blocks {
		w.Lengths = append(w.Lengths, Lengths{In: in, Out: 8})
	}
	return w
}

// cachedRun simulates design d at a low rate on w with the cache and
// returns the result and the simulator (for its requests).
func cachedRun(t *testing.T, w *Workload, c Cache, d Design) (*simResult, *simulator) {
	t.Helper()
	cfg := opt13(t)
	cfg.Workload, cfg.Cache = w, c
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := newSearcher(cfg)
	return s.sim.run(d, 1, false), s.sim
}

// Every prompt shares its first k blocks: each hits k blocks but the
// first of each pass over the samples (a pass starts cold), and the
// prefill budget falls against the same run without a cache.
func TestSharedPrefixHits(t *testing.T) {
	const k, in, samples = 4, 100, 5
	var blocks [][]int32
	for i := range samples {
		b := []int32{0, 1, 2, 3}
		for j := range in/16 - k { // the rest of the full blocks: the sample's own
			b = append(b, int32(100+10*i+j))
		}
		blocks = append(blocks, b)
	}
	for _, d := range []Design{{Prefill: 1, Decode: 1}, {Colocated: 1, Chunk: -1}, {Colocated: 1, Chunk: 64}} {
		t.Run(d.String(), func(t *testing.T) {
			res, sim := cachedRun(t, blockWorkload(in, blocks...), Cache{EngineTokens: CacheAuto}, d)
			var want, prompt int64
			for i, r := range sim.reqs {
				if !r.measured {
					continue
				}
				prompt += int64(r.in)
				if i%samples != 0 {
					want += k * 16
				}
			}
			if res.Cache.HitTokens != want || res.Cache.PromptTokens != prompt || res.Cache.HostHitTokens != 0 {
				t.Errorf("cache stats %+v, want %d hit tokens of %d", res.Cache, want, prompt)
			}
			cold, _ := cachedRun(t, blockWorkload(in, blocks...), Cache{}, d)
			if cold.Cache.HitTokens != 0 {
				t.Errorf("no cache: %d hit tokens", cold.Cache.HitTokens)
			}
			if !(res.Budget.Prefill.Mean < cold.Budget.Prefill.Mean) {
				t.Errorf("mean prefill %v s with the cache, %v s without: want lower", res.Budget.Prefill.Mean, cold.Budget.Prefill.Mean)
			}
		})
	}
}

// An LRU tier of 2 blocks, prompts by block: the hits and host loads
// worked out by hand (MRU first; a prompt's first block is cached last,
// so eviction takes its deepest block first).
func TestCacheLRU(t *testing.T) {
	type step struct {
		keys        []int64
		hit, loaded int
	}
	tests := []struct {
		name  string
		host  int
		steps []step
	}{
		{"engine only", 0, []step{
			{[]int64{1, 2}, 0, 0}, // engine 1 2
			{[]int64{3}, 0, 0},    // 3 evicts 2: engine 3 1
			{[]int64{1, 2}, 1, 0}, // 1 hits; 2 evicts 1, then 1 evicts 3: engine 1 2
			{[]int64{3}, 0, 0},    // 3 evicts 2: engine 3 1
			{[]int64{1}, 1, 0},    // engine 1 3
			{[]int64{1, 2}, 1, 0},
		}},
		{"host tier", 2, []step{
			{[]int64{1, 2}, 0, 0}, // engine 1 2
			{[]int64{3}, 0, 0},    // engine 3 1, host 2
			{[]int64{1, 2}, 2, 1}, // 2 loads from the host; engine 1 2, host 3
			{[]int64{3, 4}, 1, 1}, // 3 loads; engine 3 4, host 1 2
			{[]int64{1, 2}, 2, 2}, // engine 1 2, host 3 4
			{[]int64{5}, 0, 0},    // engine 5 1, host 2 3 (4 dropped)
			{[]int64{3, 4}, 1, 1},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var c wCache
			c.reset(2, tc.host)
			for i, s := range tc.steps {
				if hit, loaded := c.use(s.keys); hit != s.hit || loaded != s.loaded {
					t.Errorf("step %d %v: hit %d loaded %d, want %d and %d", i, s.keys, hit, loaded, s.hit, s.loaded)
				}
				if len(c.engine.idx) > 2 || len(c.host.idx) > tc.host {
					t.Errorf("step %d: %d blocks in the engine tier, %d in the host tier: over capacity", i, len(c.engine.idx), len(c.host.idx))
				}
				for k := range c.engine.idx {
					if c.host.has(k) {
						t.Errorf("step %d: block %d in both tiers", i, k)
					}
				}
			}
		})
	}
}

// The same eviction through the simulation: samples A = blocks 0 1,
// B = block 2, A again, on an engine tier of 2 blocks and one prefill
// worker: per pass, the second A hits block 0 only (B evicted block 1).
func TestCacheEvictionInSimulation(t *testing.T) {
	w := blockWorkload(33, []int32{0, 1}, []int32{2}, []int32{0, 1})
	res, sim := cachedRun(t, w, Cache{EngineTokens: 2 * 16}, Design{Prefill: 1, Decode: 1})
	var want int64
	for i, r := range sim.reqs {
		if r.measured && i%3 == 2 {
			want += 16
		}
	}
	if want == 0 || res.Cache.HitTokens != want {
		t.Errorf("%d hit tokens, want %d", res.Cache.HitTokens, want)
	}
}

// A cache of no capacity, or a workload without blocks, plans exactly as
// before caches were simulated: same bytes.
func TestNoCacheIsTodaysPlan(t *testing.T) {
	w, err := LoadWorkload("testdata/mooncake.jsonl", LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !w.HasBlocks() {
		t.Fatal("the Mooncake test trace names no blocks")
	}
	plain := *w
	plain.Blocks, plain.BlockTokens = nil, 0
	plan := func(w *Workload, c Cache) string {
		cfg := opt13(t)
		cfg.Workload, cfg.Cache, cfg.Requests, cfg.GPUBudget = w, c, 100, 4
		p, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := WriteJSON(&b, p); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	today := plan(&plain, Cache{})
	for name, c := range map[string]Cache{
		"zero":                  {},
		"zero tiers, routing":   {Routing: RouteLeastLoaded, HostLinkBytesPerSec: 1e9},
		"no blocks, with cache": {EngineTokens: CacheAuto, HostTokens: 1000},
	} {
		ww := w
		if name == "no blocks, with cache" {
			ww = &plain
		}
		if diff := cmp.Diff(today, plan(ww, c)); diff != "" {
			t.Errorf("%s: plan differs (-today +got):\n%s", name, diff)
		}
	}
	if on := plan(w, Cache{EngineTokens: CacheAuto}); on == today {
		t.Error("a cache changes nothing in the plan")
	}
}

// Plans and sweeps with caches are deterministic, beside a CPU hog too.
func TestCachePlanDeterministic(t *testing.T) {
	w, err := LoadWorkload("testdata/mooncake.jsonl", LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := func() string {
		cfg := opt13(t)
		cfg.Workload, cfg.Requests, cfg.GPUBudget = w, 100, 4
		cfg.Cache = Cache{EngineTokens: 4096, HostTokens: 8192}
		p, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if p.CacheSweep, err = SweepCache(context.Background(), cfg); err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := WriteJSON(&b, p); err != nil {
			t.Fatal(err)
		}
		if err := WriteTable(&b, p); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	first := out()
	stop := hog()
	second := out()
	stop()
	if first != second {
		t.Errorf("plans differ:\n--- first\n%s\n--- second\n%s", first, second)
	}
	for _, want := range []string{`"prefix_cache"`, `"cache_sweep"`, "What each prefix-cache size buys"} {
		if !bytes.Contains([]byte(first), []byte(want)) {
			t.Errorf("output lacks %s", want)
		}
	}
}

func TestCacheValidate(t *testing.T) {
	for name, c := range map[string]Cache{
		"engine":  {EngineTokens: -2},
		"host":    {HostTokens: -1},
		"link":    {HostLinkBytesPerSec: -1},
		"routing": {Routing: "random"},
	} {
		cfg := opt13(t)
		cfg.Cache = c
		if err := cfg.Validate(); err == nil {
			t.Errorf("%s: %+v validates", name, c)
		}
	}
	w := blockWorkload(100, []int32{0})
	w.BlockTokens = 0
	if err := w.Validate(); err == nil {
		t.Error("blocks of 0 tokens validate")
	}
}
