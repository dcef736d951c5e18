package planner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/pdserve/pdserve/pkg/router"
	"github.com/pdserve/pdserve/pkg/router/framework"
	"github.com/pdserve/pdserve/pkg/router/plugins/maxscore"
	"github.com/pdserve/pdserve/pkg/router/plugins/prefixoverlap"
	"github.com/pdserve/pdserve/pkg/router/plugins/queuedtokens"
)

// Routing is how the simulated router spreads prompts over the workers
// that prefill them when the prefix caches are simulated.
type Routing string

// Routings (Cache.Routing).
const (
	// RoutePrefix scores each worker as the router's prefill profile does
	// by default (router.DefaultPrefillWeights: the prefix-overlap and
	// queued-tokens scorers, max-score picker).
	RoutePrefix Routing = "prefix"
	// RouteLeastLoaded sends each prompt to the worker with the fewest
	// queued prompt tokens, as without caches.
	RouteLeastLoaded Routing = "least-loaded"
)

// DefaultHostLinkBytesPerSec is the host-to-GPU bandwidth a host-tier hit
// loads over when Cache.HostLinkBytesPerSec is 0: PCIe Gen5 x16, about
// 64 GB/s per direction (PCI-SIG's 32 GT/s per lane × 16 lanes, 128b/130b
// coding: 63 GB/s), the host link of the H100 and H200 (NVIDIA's H100 and
// H200 data sheets: "PCIe Gen5: 128 GB/s", both directions together). The
// performance-model profiles carry no host-link figure.
const DefaultHostLinkBytesPerSec = 64e9

// CacheAuto as Cache.EngineTokens sizes each worker's engine tier to its
// profile's KV memory (perfmodel.Profile.MaxKVTokens): a worker caches
// finished prompts in the engine memory live sequences do not use and
// evicts on demand.
const CacheAuto = -1

// Cache describes the prefix caches the simulation runs on a workload
// that names its prompts' blocks (Workload.Blocks); other workloads
// ignore it. The zero value simulates none, and plans as if no prompt
// token hit.
//
// Each worker that prefills (a prefill worker, a colocated worker) holds
// an LRU of blocks in two tiers: engine memory and host memory. A prompt
// looks up its leading full blocks in both (the match stops at the first
// miss, as chained hashes do); hit tokens are not computed, and those
// found in the host tier are first loaded over the host link, serially
// before the worker's step (no overlap: an upper bound on the load's
// cost). The prompt's blocks then become the engine tier's most recently
// used, its first block last, so that eviction takes a prompt's deepest
// blocks first; blocks the engine tier evicts move to the host tier,
// which drops its least recently used. Hits leave one prompt token to
// compute. Caches start empty at each simulated run. A decode worker
// holds an engine tier of the same size (CacheAuto: its KV memory, which
// cached blocks share with live sequences, as the workers' caches do),
// filled with the KV it receives: a prompt's KV crosses the link less the
// prefix the decode worker holds. The decode worker is chosen as without
// caches (the fewest requests among those with room), not by its cache.
type Cache struct {
	// EngineTokens is each worker's engine-tier capacity, tokens: ≥ 0,
	// or CacheAuto.
	EngineTokens int64 `json:"engine_tokens"`
	// HostTokens is each worker's host-tier capacity, tokens, ≥ 0.
	HostTokens int64 `json:"host_tokens"`
	// HostLinkBytesPerSec is the bandwidth host-tier hits load over,
	// bytes/s of true KV; 0 means DefaultHostLinkBytesPerSec.
	HostLinkBytesPerSec float64 `json:"host_link_bytes_per_s"`
	// Routing is RoutePrefix ("" means it) or RouteLeastLoaded.
	Routing Routing `json:"routing"`
}

func (c Cache) validate() error {
	switch {
	case c.EngineTokens < CacheAuto:
		return fmt.Errorf("prefix cache engine tokens %d: want ≥ 0, or %d for the profile's KV memory", c.EngineTokens, CacheAuto)
	case c.HostTokens < 0:
		return fmt.Errorf("prefix cache host tokens %d < 0", c.HostTokens)
	case !finiteNonNeg(c.HostLinkBytesPerSec):
		return fmt.Errorf("host link %v bytes/s must be finite and ≥ 0", c.HostLinkBytesPerSec)
	}
	switch c.Routing {
	case "", RoutePrefix, RouteLeastLoaded:
	default:
		return fmt.Errorf("routing %q: want %s or %s", c.Routing, RoutePrefix, RouteLeastLoaded)
	}
	return nil
}

func (c Cache) routing() Routing {
	if c.Routing == "" {
		return RoutePrefix
	}
	return c.Routing
}

func (c Cache) hostLink() float64 {
	if c.HostLinkBytesPerSec > 0 {
		return c.HostLinkBytesPerSec
	}
	return DefaultHostLinkBytesPerSec
}

// engineTokens is the engine tier of a worker whose KV memory holds
// kvTokens.
func (c Cache) engineTokens(kvTokens int64) int64 {
	if c.EngineTokens == CacheAuto {
		return kvTokens
	}
	return c.EngineTokens
}

// cacheOn reports whether the simulation runs prefix caches: the
// workload names its blocks and some tier has room.
func (c *Config) cacheOn() bool {
	return c.Workload.HasBlocks() && (c.Cache.EngineTokens != 0 || c.Cache.HostTokens != 0)
}

// CacheSummary is what a plan says of its simulated prefix caches.
type CacheSummary struct {
	Cache
	// EngineTokensPrefill and EngineTokensColocated are the engine tiers
	// of a prefill and a colocated worker, tokens (CacheAuto resolved).
	EngineTokensPrefill   int64 `json:"engine_tokens_prefill"`
	EngineTokensColocated int64 `json:"engine_tokens_colocated"`
	BlockTokens           int   `json:"block_tokens"`
	// Ceiling is the workload's infinite-cache hit ratio
	// (Workload.PrefixCeiling).
	Ceiling float64 `json:"ceiling"`
}

// CacheStats are a simulated run's prefix-cache figures over its
// measured requests, tokens.
type CacheStats struct {
	PromptTokens int64 `json:"prompt_tokens"`
	// HitTokens were not computed; HostHitTokens of them were loaded from
	// the host tier.
	HitTokens     int64 `json:"hit_tokens"`
	HostHitTokens int64 `json:"host_hit_tokens"`
	// HitRatio is HitTokens / PromptTokens.
	HitRatio float64 `json:"hit_ratio"`
}

// blockLRU is one tier of a worker's cache: block ids, least recently
// used evicted first. Entries live in a slab linked by index (0 is the
// list's sentinel), so a run allocates nothing once warm.
type blockLRU struct {
	cap  int // blocks
	idx  map[int64]int32
	ent  []lruEnt
	free []int32
}

type lruEnt struct {
	key        int64
	prev, next int32
}

func (l *blockLRU) reset(capBlocks int) {
	l.cap = capBlocks
	if l.idx == nil {
		l.idx = map[int64]int32{}
	}
	clear(l.idx)
	l.ent = append(l.ent[:0], lruEnt{})
	l.free = l.free[:0]
}

func (l *blockLRU) has(k int64) bool { _, ok := l.idx[k]; return ok }

func (l *blockLRU) unlink(i int32) {
	e := &l.ent[i]
	l.ent[e.prev].next, l.ent[e.next].prev = e.next, e.prev
}

// front links i as the most recently used.
func (l *blockLRU) front(i int32) {
	first := l.ent[0].next
	l.ent[i].prev, l.ent[i].next = 0, first
	l.ent[first].prev, l.ent[0].next = i, i
}

// remove drops k; it reports whether k was there.
func (l *blockLRU) remove(k int64) bool {
	i, ok := l.idx[k]
	if !ok {
		return false
	}
	l.unlink(i)
	delete(l.idx, k)
	l.free = append(l.free, i)
	return true
}

// put makes k the most recently used, inserting it when absent; it
// returns the evicted key, if any (ok false: none). With capacity 0 k
// itself is evicted at once.
func (l *blockLRU) put(k int64) (evicted int64, ok bool) {
	if i, in := l.idx[k]; in {
		l.unlink(i)
		l.front(i)
		return 0, false
	}
	if l.cap <= 0 {
		return k, true
	}
	if len(l.idx) >= l.cap {
		last := l.ent[0].prev
		evicted, ok = l.ent[last].key, true
		l.remove(evicted)
	}
	var i int32
	if n := len(l.free); n > 0 {
		i, l.free = l.free[n-1], l.free[:n-1]
	} else {
		l.ent = append(l.ent, lruEnt{})
		i = int32(len(l.ent) - 1)
	}
	l.ent[i].key = k
	l.idx[k] = i
	l.front(i)
	return evicted, ok
}

// wCache is one worker's two tiers.
type wCache struct {
	engine, host blockLRU
}

func (c *wCache) reset(engineBlocks, hostBlocks int) {
	c.engine.reset(engineBlocks)
	c.host.reset(hostBlocks)
}

// match is the number of leading keys held in either tier.
func (c *wCache) match(keys []int64) int {
	n := 0
	for n < len(keys) && (c.engine.has(keys[n]) || c.host.has(keys[n])) {
		n++
	}
	return n
}

// use looks up the leading keys of a prompt and caches all of them: it
// returns the leading blocks held (hit) and, of those, the blocks that
// came from the host tier (loaded). See Cache for the order.
func (c *wCache) use(keys []int64) (hit, loaded int) {
	hit = c.match(keys)
	for _, k := range keys[:hit] {
		if c.host.remove(k) {
			loaded++
		}
	}
	for j := len(keys) - 1; j >= 0; j-- {
		c.host.remove(keys[j]) // a block lives in one tier
		if ev, ok := c.engine.put(keys[j]); ok && c.host.cap > 0 {
			c.host.put(ev)
		}
	}
	return hit, loaded
}

// prefixRouter scores workers for a prompt as the router's default
// prefill profile does, with its own scorers and picker.
type prefixRouter struct {
	weights router.Weights
	in      framework.Input
	cs      []framework.Candidate
	s1, s2  []float64
	totals  []float64
}

func newPrefixRouter(workers int, prefix string) *prefixRouter {
	r := &prefixRouter{weights: router.DefaultPrefillWeights, cs: make([]framework.Candidate, workers)}
	for i := range r.cs {
		r.cs[i].Worker.ID = fmt.Sprintf("%s-%d", prefix, i)
	}
	r.s1, r.s2, r.totals = make([]float64, workers), make([]float64, workers), make([]float64, workers)
	return r
}

// pick returns the worker for a prompt of blocks full blocks, given each
// worker's leading hit blocks and queued prompt tokens.
func (r *prefixRouter) pick(blocks int, hits, queued func(i int) int) int {
	r.in.Request.PrefixHashes = r.in.Request.PrefixHashes[:0]
	for range blocks {
		r.in.Request.PrefixHashes = append(r.in.Request.PrefixHashes, 0) // only their number counts
	}
	for i := range r.cs {
		r.cs[i].PrefixHitBlocks = hits(i)
		r.cs[i].Load.QueuedPrefillTokens = queued(i)
	}
	(&prefixoverlap.Scorer{}).Score(&r.in, r.cs, r.s1)
	(&queuedtokens.Scorer{}).Score(&r.in, r.cs, r.s2)
	for i := range r.cs {
		r.totals[i] = r.weights.Prefix*clamp01(r.s1[i]) + r.weights.Queue*clamp01(r.s2[i])
	}
	return (&maxscore.Picker{}).Pick(&r.in, r.cs, r.totals)
}

func clamp01(x float64) float64 {
	if math.IsNaN(x) {
		return 0
	}
	return min(max(x, 0), 1)
}

// text describes the caches in one line, for the reports.
func (c *CacheSummary) text() string {
	return fmt.Sprintf("prefix caches per worker: engine %s tokens (prefill), %s (colocated), host %s tokens at %s GB/s; %d-token blocks, %s routing; infinite-cache hit ratio %.3f",
		tokensText(c.EngineTokensPrefill), tokensText(c.EngineTokensColocated), tokensText(c.HostTokens), num(c.HostLinkBytesPerSec/1e9), c.BlockTokens, c.Routing, c.Ceiling)
}

// tokensText writes a token count as 480k, 1.5M or 512.
func tokensText(n int64) string {
	switch {
	case n >= 1e6:
		return num(float64(n)/1e6) + "M"
	case n >= 1e3:
		return num(float64(n)/1e3) + "k"
	}
	return fmt.Sprint(n)
}

// ratioOf is x/of, 0 when of is 0.
func ratioOf(x, of float64) float64 {
	if of == 0 {
		return 0
	}
	return x / of
}

// pct is part/whole as a percentage, "-" when whole is 0.
func pct(part, whole int64) string {
	if whole == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", float64(part)/float64(whole)*100)
}

// CacheRow is one prefix-cache size of a sweep (SweepCache) and the plan
// it buys.
type CacheRow struct {
	// EngineTokens and HostTokens are each worker's tiers, tokens.
	EngineTokens int64 `json:"engine_tokens"`
	HostTokens   int64 `json:"host_tokens"`
	Feasible     bool  `json:"feasible"`
	// Recommended, Design, GPUs, MaxRate and GoodputPerGPU are the plan's
	// recommended design (Plan.Recommended) and its figures; Rate,
	// Attainment and HitRatio its prediction at its operating rate.
	Recommended   string  `json:"recommended,omitempty"`
	Design        Design  `json:"design"`
	GPUs          int     `json:"gpus"`
	MaxRate       float64 `json:"max_rate"`
	GoodputPerGPU float64 `json:"goodput_per_gpu"`
	Rate          float64 `json:"rate"`
	Attainment    float64 `json:"attainment"`
	HitRatio      float64 `json:"hit_ratio"`
}

// CacheSweepEngine and CacheSweepHost are the sizes SweepCache plans
// for, as multiples of the configured engine tier: engine tiers alone,
// then the full engine tier with host tiers.
var (
	CacheSweepEngine = []float64{0, 0.25, 0.5, 1}
	CacheSweepHost   = []float64{1, 2, 4}
)

// SweepCache plans cfg again for each cache size of CacheSweepEngine
// (no host tier) and CacheSweepHost (the whole engine tier, host tiers of
// those multiples of it), the multiples of cfg's engine tier of a prefill
// worker (CacheAuto resolved), so that a capacity planner sees what
// each size, host memory included, buys against more GPUs. The first row
// (no cache) is the plan without prefix caching, whose samples are
// drawn at random as for any workload; the others replay the trace in
// order. It returns nil when cfg's workload names no blocks or cfg has
// no engine tier. Errors are Run's other than ErrInfeasible (an
// infeasible size is a row with Feasible false). Deterministic in cfg.
func SweepCache(ctx context.Context, cfg *Config) ([]CacheRow, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	base := cfg.Cache.engineTokens(cfg.Prefill.MaxKVTokens())
	if !cfg.Workload.HasBlocks() || base <= 0 {
		return nil, nil
	}
	type size struct{ engine, host int64 }
	var sizes []size
	for _, f := range CacheSweepEngine {
		sizes = append(sizes, size{int64(f * float64(base)), 0})
	}
	for _, f := range CacheSweepHost {
		sizes = append(sizes, size{base, int64(f * float64(base))})
	}
	rows := make([]CacheRow, 0, len(sizes))
	for _, sz := range sizes {
		c := *cfg
		c.Cache.EngineTokens, c.Cache.HostTokens = sz.engine, sz.host
		pl, err := Run(ctx, &c)
		if err != nil && !errors.Is(err, ErrInfeasible) {
			return nil, err
		}
		row := CacheRow{EngineTokens: sz.engine, HostTokens: sz.host, Feasible: pl.Feasible, Recommended: pl.Recommended}
		pr, rate := pl.Disaggregated, pl.MaxRate.Disaggregated
		if pl.Recommended == "colocated" {
			pr, rate = pl.Colocated, pl.MaxRate.Colocated
		}
		if pr != nil {
			row.Design, row.GPUs, row.MaxRate, row.Rate, row.Attainment = pr.Design, pr.GPUs, rate, pr.Rate, pr.Attainment
			row.GoodputPerGPU = rate / float64(pr.GPUs)
			if pr.PrefixCache != nil {
				row.HitRatio = pr.PrefixCache.HitRatio
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// WriteCacheSweep writes rows (SweepCache's) as a text table.
func WriteCacheSweep(w io.Writer, rows []CacheRow, unit string) error {
	ew := &errWriter{w: w}
	U := strings.ToUpper(unit)
	ew.printf("\nWhat each prefix-cache size buys (tokens per worker; the recommended design at each)\n")
	tw := tabwriter.NewWriter(ew, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "ENGINE\tHOST\tHIT RATIO\tDESIGN\t%sS\tMAX RATE\tGOODPUT/%s\tAT RATE\tATTAIN\n", U, U)
	for _, r := range rows {
		if !r.Feasible {
			fmt.Fprintf(tw, "%s\t%s\t-\tnone meets the SLO\t\t\t\t\t\n", tokensText(r.EngineTokens), tokensText(r.HostTokens))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%.3f\t%s\t%d\t%s\t%s\t%s\t%.1f%%\n", tokensText(r.EngineTokens), tokensText(r.HostTokens),
			r.HitRatio, r.Design, r.GPUs, num(r.MaxRate), num(r.GoodputPerGPU), num(r.Rate), r.Attainment*100)
	}
	if err := tw.Flush(); err != nil && ew.err == nil {
		ew.err = err
	}
	ew.printf("The first row plans without prefix caching (samples drawn at random); the others replay the trace in order through the caches.\n")
	return ew.err
}
