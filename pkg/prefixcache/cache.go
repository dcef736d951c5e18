package prefixcache

import (
	"container/list"
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"sync"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// Defaults of Options.
const (
	// DefaultBlockTokens is the block size of the hashes: the decode
	// workers' default block size, which the coordinator hashes prompts
	// with for routing.
	DefaultBlockTokens = vocab.DefaultBlockTokens
	// DefaultMaxEntries bounds the cached engine sequences.
	DefaultMaxEntries = 256
	// DefaultDigestHashes is how many block hashes a heartbeat carries:
	// 4096 hashes are 64Ki prompt tokens at 16 tokens a block.
	DefaultDigestHashes = 4096
	// Auto is the MaxTokens that sizes the cache by the engine memory
	// live sequences do not use (Options.Resolve): the default.
	Auto = -1
)

// Options configure a Cache. The zero MaxTokens turns the cache off; Auto
// (the default) must be resolved to a size before New.
type Options struct {
	// MaxTokens bounds the KV tokens held by cached sequences (the
	// engine's Len of each). 0: no cache; Auto: sized by the worker
	// (Resolve). ≥ Auto.
	MaxTokens int
	// MaxEntries bounds the cached engine sequences. > 0 when MaxTokens
	// is.
	MaxEntries int
	// BlockTokens is the size of a hashed block in tokens. > 0.
	BlockTokens int
	// HostBytes is the host tier's budget (Host): bytes of KV, the
	// model's true size, of evicted entries kept in host RAM. 0: no host
	// tier; Auto: FreeMemory() / HostAutoDivisor at New. ≥ Auto. Only
	// with the cache on.
	HostBytes int64
	// DiskDir and DiskBytes are the disk tier's directory (the cache
	// makes a directory of its own in it) and byte budget (the model's
	// true KV size): the host tier's evictions are written there (Disk).
	// DiskBytes 0: no disk tier; > 0 needs DiskDir and a host tier.
	DiskDir   string
	DiskBytes int64
	// HashKey keys the block hashes (Hashes): the deployment's secret,
	// the same as the coordinator's (--kv-hash-key-file). The zero key
	// hashes publicly (kv.HashBlocks). Not a flag of this package.
	HashKey kv.HashKey
}

// DefaultOptions returns a cache sized by its worker (Auto), with the
// default entry bound and block size.
func DefaultOptions() Options {
	return Options{MaxTokens: Auto, MaxEntries: DefaultMaxEntries, BlockTokens: DefaultBlockTokens, HostBytes: Auto}
}

// AddFlags registers --prefix-cache-tokens, --prefix-cache-entries,
// --host-cache-bytes, --disk-cache-dir and --disk-cache-bytes on fs, with
// o's values as defaults.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.MaxTokens, "prefix-cache-tokens", o.MaxTokens, "KV tokens of finished prompts kept in the engine for prefix reuse, LRU; they use only engine memory live sequences do not, and yield it to them on demand (-1: as many as the engine's KV memory holds, the KV pool on decode workers; 0: no prefix cache)")
	fs.IntVar(&o.MaxEntries, "prefix-cache-entries", o.MaxEntries, "most cached prompts (engine sequences) in the prefix cache")
	fs.Int64Var(&o.HostBytes, "host-cache-bytes", o.HostBytes, fmt.Sprintf("bytes of host RAM for the prefix cache's host tier: prompts evicted from the engine are copied there and loaded back on a hit, LRU (-1: 1/%d of the free memory at start: MemAvailable, or the container's memory limit less its usage when that is less; none on a decode worker of role decode; 0: no host tier; needs the prefix cache)", HostAutoDivisor))
	fs.StringVar(&o.DiskDir, "disk-cache-dir", o.DiskDir, "directory (a local disk, e.g. NVMe) for the prefix cache's disk tier: prompts the host tier evicts are written there and loaded back on a hit, LRU; the worker makes a directory of its own in it and removes it when it stops, and at start removes those of workers that died without stopping (several workers may share the directory)")
	fs.Int64Var(&o.DiskBytes, "disk-cache-bytes", o.DiskBytes, "bytes of KV (the model's true size) for the disk tier in --disk-cache-dir (0: no disk tier; needs a host tier)")
}

// Enabled reports whether o turns the cache on (a size, or Auto).
func (o Options) Enabled() bool { return o.MaxTokens != 0 }

// Resolve returns o with an Auto MaxTokens replaced by tokens, the KV
// tokens of the worker's engine memory (0 or less: off); other sizes stay.
func (o Options) Resolve(tokens int) Options {
	if o.MaxTokens == Auto {
		o.MaxTokens = max(tokens, 0)
	}
	return o
}

// Validate reports every invalid field in one error.
func (o Options) Validate() error {
	var errs []error
	if o.MaxTokens < Auto {
		errs = append(errs, fmt.Errorf("prefix-cache-tokens %d must be -1 (auto), 0 (off) or positive", o.MaxTokens))
	}
	if o.MaxTokens != 0 && o.MaxEntries <= 0 {
		errs = append(errs, fmt.Errorf("prefix-cache-entries %d must be positive", o.MaxEntries))
	}
	if o.HostBytes < Auto {
		errs = append(errs, fmt.Errorf("host-cache-bytes %d must be -1 (auto), 0 (off) or positive", o.HostBytes))
	}
	if o.DiskBytes < 0 {
		errs = append(errs, fmt.Errorf("disk-cache-bytes %d must be 0 (off) or positive", o.DiskBytes))
	}
	if o.DiskBytes > 0 && o.DiskDir == "" {
		errs = append(errs, errors.New("disk-cache-bytes needs disk-cache-dir"))
	}
	if o.DiskBytes > 0 && o.HostBytes == 0 {
		errs = append(errs, errors.New("disk-cache-bytes needs a host tier (host-cache-bytes not 0)"))
	}
	if o.BlockTokens <= 0 {
		errs = append(errs, fmt.Errorf("prefix cache block tokens %d must be positive", o.BlockTokens))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("prefixcache: invalid options: %w", err)
	}
	return nil
}

// entry is one cached engine sequence. Guarded by Cache.mu.
type entry struct {
	seq    engine.SeqID
	hashes []kv.Hash // its prompt's full blocks, in order
	tokens int       // KV tokens the sequence holds
	pins   int
	el     *list.Element
	// source is where the prefix of its KV came from: "" computed here,
	// else the verified identity of the peer it was pulled from (a
	// spot-checked pull, or a fork of one): see InsertFrom.
	source string
}

// Hit is the result of Acquire. A hit (Tokens > 0) pins its entry until
// Release.
type Hit struct {
	// Seq is the cached engine sequence to Fork from.
	Seq engine.SeqID
	// Tokens is the prefix to fork: a whole number of blocks, 0 on a
	// miss.
	Tokens int
	// Hashes are the hit blocks' hashes (aliasing the lookup's slice).
	Hashes []kv.Hash
	// Source is the entry's provenance (see InsertFrom): a sequence
	// forked from it carries it on.
	Source string
	e      *entry
}

// Stats are the cache's counters (since New) and occupancy.
type Stats struct {
	Lookups    uint64 // Acquire calls
	Hits       uint64 // Acquire calls that hit at least one block
	HitTokens  uint64 // tokens of those hits: prefill tokens saved
	Inserts    uint64 // sequences taken in
	Adopted    uint64 // sequences taken in from another cache (Adopt)
	Evictions  uint64 // entries dropped for the bounds
	Reclaims   uint64 // entries dropped to give their KV to a request (Reclaim)
	Superseded uint64 // entries dropped for a newer one holding their blocks and more
	Tokens     int    // KV tokens held now
	Entries    int    // engine sequences held now
	Pinned     int    // entries pinned now
	// Reclaimable is the KV tokens of unpinned entries now: what Reclaim
	// can give back.
	Reclaimable int
	// Host is the host tier's (zero without one).
	Host HostStats
	// Disk is the disk tier's (zero without one).
	Disk HostStats
	// Peer counts the pulls from peer workers and the exports to them.
	Peer PeerStats
}

// Cache is the index. A nil *Cache is a cache that is off: Acquire
// misses, Insert hands the sequence back to Free, and the rest return
// nothing. Safe for concurrent use.
type Cache struct {
	o Options

	mu     sync.Mutex
	byHash map[kv.Hash][]*entry // every entry holding a block, in insertion order
	lru    list.List            // of *entry; front = most recently used
	tokens int
	pinned int
	// pinnedTokens is the KV tokens of the pinned entries.
	pinnedTokens int
	st           Stats
	// obs is told of every hash byHash gains or loses; nil: nobody.
	obs Observer
	// host is the host tier; nil: none.
	host *Host
	// spill holds the entries evicted (not superseded, not drained) while
	// a host tier is on, by sequence, until Free copies them there.
	spill map[engine.SeqID]*entry
}

// Observer is told of every block hash the cache starts holding (its
// first entry holding it arrived) and stops holding (its last entry
// holding it left), in the order the cache changed: replaying the calls
// on an empty set yields the cache's blocks (AppendBlocks). Insert,
// eviction, Trim, Shrink, Reclaim and Drain all report. The cache calls
// it with its lock held, on the goroutine of the call that changed it:
// an Observer must return quickly without blocking (buffer, do not
// publish) and must not call the cache.
type Observer interface {
	Stored(h kv.Hash)
	Removed(h kv.Hash)
}

// Blocks is what a Cache tells of its blocks, without access to its
// entries: for a worker's KV events.
type Blocks interface {
	SetObserver(o Observer)
	AppendBlocks(dst []uint64, mark func()) []uint64
}

var _ Blocks = (*Cache)(nil)

// SetObserver makes o (nil: nobody) the cache's observer from now on; a
// no-op on a nil cache. Blocks held already are not reported: take
// AppendBlocks for them.
func (c *Cache) SetObserver(o Observer) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.obs = o
}

// AppendBlocks appends every block hash the cache holds, in no particular
// order, to dst and returns it (nil cache: dst). mark, when not nil, is
// called while the cache's lock is still held, after the hashes were
// gathered: no Observer call comes between the list and mark, so an
// observer can tell which of its reports the list includes. mark must not
// call the cache.
func (c *Cache) AppendBlocks(dst []uint64, mark func()) []uint64 {
	if c == nil {
		if mark != nil {
			mark()
		}
		return dst
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	dst = slices.Grow(dst, len(c.byHash))
	for h := range c.byHash {
		dst = append(dst, uint64(h))
	}
	if mark != nil {
		mark()
	}
	return dst
}

// New returns an empty cache, or nil when o turns it off. Errors: o is
// invalid, or its MaxTokens is Auto (Resolve it first).
func New(o Options) (*Cache, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.MaxTokens == Auto {
		return nil, errors.New("prefixcache: an auto size must be resolved before New")
	}
	if !o.Enabled() {
		return nil, nil
	}
	c := &Cache{o: o, byHash: make(map[kv.Hash][]*entry)}
	if hb := o.HostBytes; hb != 0 {
		if hb == Auto {
			var err error
			if hb, err = AutoHostBytes(); err != nil {
				return nil, fmt.Errorf("%w (set host-cache-bytes)", err)
			}
			if hb == 0 {
				return nil, errors.New("prefixcache: no free memory for an auto host tier (set host-cache-bytes)")
			}
		}
		c.host = newHost(hb, o.BlockTokens)
		c.spill = make(map[engine.SeqID]*entry)
		if o.DiskBytes > 0 {
			d, err := newDisk(o.DiskDir, o.DiskBytes, o.BlockTokens)
			if err != nil {
				return nil, err
			}
			c.host.disk = d
		}
	}
	return c, nil
}

// Host returns the cache's host tier (nil: none, or a nil cache).
func (c *Cache) Host() *Host {
	if c == nil {
		return nil
	}
	return c.host
}

// HostDeeper reports whether the host tier, or disk (the disk tier's
// entry ReadDisk read; nil: none), holds a longer prefix of hashes,
// within maxBlocks, than the engine tier: the prompt should Load from the
// host instead of Acquire. Changes nothing.
func (c *Cache) HostDeeper(hashes []kv.Hash, maxBlocks int, disk *DiskRead) bool {
	if c == nil || c.host == nil {
		return false
	}
	hashes = hashes[:min(len(hashes), max(maxBlocks, 0))]
	if c.host.disk == nil {
		disk = nil
	}
	return max(c.host.Match(hashes), disk.depth(hashes)) > c.Match(hashes)
}

// ReadDisk reads the disk tier's entry holding the longest prefix of
// hashes, at most maxBlocks blocks, when the disk tier holds more of it
// than the engine and host tiers, for Host.Load to import: the worker
// calls it before its request reaches the engine's loop, so that no file
// is read under the engine lock. The read gives up after DiskReadTimeout
// or when ctx ends. It returns nil when there is nothing to read, or the
// read failed: the prompt is then computed. A bad file (not a regular
// file of the entry's size, or one that fails its checksum) drops its
// entry, counted in Stats.Disk.BadEntries; other failures count in
// Stats.Disk.Failures.
func (c *Cache) ReadDisk(ctx context.Context, hashes []kv.Hash, maxBlocks int) *DiskRead {
	d := c.Host().Disk()
	if d == nil {
		return nil
	}
	lim := hashes[:min(len(hashes), max(maxBlocks, 0))]
	if d.Match(lim) <= max(c.Match(lim), c.host.Match(lim)) {
		return nil
	}
	r, _ := d.readEntry(ctx, lim, len(lim)) // counted in its stats
	return r
}

// Free frees seqs, sequences the cache returned, on eng, copying into the
// host tier first those it evicted (Insert's, Trim's, Shrink's and
// Reclaim's evictions; not those it superseded or drained). A copy the
// engine refuses is returned after every sequence was freed (the rest are
// copied and freed all the same). The caller holds its engine lock. A nil
// cache frees them all.
func (c *Cache) Free(eng engine.Engine, seqs []engine.SeqID) error {
	var errs []error
	for _, q := range seqs {
		if c != nil && c.host != nil {
			c.mu.Lock()
			e := c.spill[q]
			delete(c.spill, q)
			c.mu.Unlock()
			if e != nil {
				if err := c.host.spill(eng, q, e.hashes, e.source); err != nil {
					errs = append(errs, err)
				}
			}
		}
		eng.Free(q)
	}
	return errors.Join(errs...)
}

// BlockTokens returns the tokens per hashed block (DefaultBlockTokens for
// a nil cache).
func (c *Cache) BlockTokens() int {
	if c == nil {
		return DefaultBlockTokens
	}
	return c.o.BlockTokens
}

// Hashes returns the chained hashes of the full blocks of tokens under
// the cache's HashKey from root (the request's partition, kv.HashKey.Root
// of its tenant, as the coordinator hashes prompts), or nil for a nil
// cache. The caller owns the slice.
func (c *Cache) Hashes(root kv.Hash, tokens []int32) []kv.Hash {
	if c == nil {
		return nil
	}
	return c.o.HashKey.Blocks(root, tokens, c.o.BlockTokens)
}

// MaxHitBlocks returns the most blocks a prompt of n tokens may take from
// the cache: every full block but one token must stay to compute.
func (c *Cache) MaxHitBlocks(n int) int {
	if c == nil || n <= 0 {
		return 0
	}
	return (n - 1) / c.o.BlockTokens
}

// Acquire looks up the longest cached prefix of hashes, at most maxBlocks
// blocks, and pins the entry holding it; it counts a lookup, and a hit
// when at least one block matched. The hit entry becomes the most recently
// used. A miss (Tokens 0) needs no Release.
func (c *Cache) Acquire(hashes []kv.Hash, maxBlocks int) Hit {
	return c.acquire(hashes, maxBlocks, true)
}

// acquire is Acquire; a lookup that is not the worker's own (own false:
// a peer's export) counts nothing and leaves the recency as it is.
func (c *Cache) acquire(hashes []kv.Hash, maxBlocks int, own bool) Hit {
	if c == nil {
		return Hit{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if own {
		c.st.Lookups++
	}
	n, e := chainMatch(c.byHash, (*entry).chain, hashes[:min(len(hashes), max(maxBlocks, 0))])
	if n == 0 {
		return Hit{}
	}
	if e.pins == 0 {
		c.pinned++
		c.pinnedTokens += e.tokens
	}
	e.pins++
	if own {
		c.lru.MoveToFront(e.el)
		c.st.Hits++
		c.st.HitTokens += uint64(n * c.o.BlockTokens)
	}
	return Hit{Seq: e.seq, Tokens: n * c.o.BlockTokens, Hashes: hashes[:n], Source: e.source, e: e}
}

// Source returns what Acquire(hashes, maxBlocks) would pin, changing
// nothing: the KV tokens its entry holds in the engine (0 on a miss) and
// whether the entry is pinned already. A worker counts them in the
// footprint of a fork from it: the entry stays beside the fork while it
// is copied.
func (c *Cache) Source(hashes []kv.Hash, maxBlocks int) (tokens int, pinned bool) {
	if c == nil {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.depthLocked(hashes[:min(len(hashes), max(maxBlocks, 0))])
	if n == 0 {
		return 0, false
	}
	es := c.byHash[hashes[n-1]]
	e := es[len(es)-1]
	return e.tokens, e.pins > 0
}

// Pinned returns the KV tokens and the number of the pinned entries: what
// no eviction can give back now (0, 0 for a nil cache).
func (c *Cache) Pinned() (tokens, entries int) {
	if c == nil {
		return 0, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pinnedTokens, c.pinned
}

// Match returns how many leading hashes are cached, changing nothing (no
// pin, no counters, no recency).
func (c *Cache) Match(hashes []kv.Hash) int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.depthLocked(hashes)
}

// depthLocked returns how many leading hashes some entry holds as the
// leading blocks of its chain (chainMatch): the hashes must be the
// entry's chain, not merely each held somewhere.
func (c *Cache) depthLocked(hashes []kv.Hash) int {
	n, _ := chainMatch(c.byHash, (*entry).chain, hashes)
	return n
}

func (e *entry) chain() []kv.Hash { return e.hashes }

// Release unpins the entry of h; a miss is a no-op. It never evicts (the
// caller may not hold the engine lock): the next Insert or Trim restores
// the bounds.
func (c *Cache) Release(h Hit) {
	if c == nil || h.e == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if h.e.pins <= 0 {
		panic("prefixcache: Release of an entry that is not pinned")
	}
	h.e.pins--
	if h.e.pins == 0 {
		c.pinned--
		c.pinnedTokens -= h.e.tokens
	}
}

// Insert takes seq, an engine sequence holding tokens KV tokens whose
// first len(hashes) × BlockTokens tokens are the prompt blocks hashes
// (the caller's slice is kept: it must not change it), as the most
// recently used entry. It returns the sequences the caller must Free now,
// under its engine lock: seq itself when the cache is off, the sequence
// has no full block, exceeds MaxTokens alone, or adds nothing (an entry
// holds all its blocks already, which becomes the most recent instead);
// entries it supersedes (their blocks are a prefix of its own); and the
// least recently used unpinned entries beyond the bounds.
func (c *Cache) Insert(seq engine.SeqID, hashes []kv.Hash, tokens int) []engine.SeqID {
	return c.InsertFrom(seq, hashes, tokens, "")
}

// InsertFrom is Insert of a sequence whose KV is tagged with source: ""
// when this worker computed all of it, else the verified identity of the
// peer its prefix was pulled from (a pull the worker's spot check passed,
// or a sequence forked or loaded from such an entry: Hit.Source,
// HostLoad.Source). The tag goes with the entry into the host tier, and
// DropSource removes the entries of a peer found untrusted later. Pulled
// KV that was not verified must not be inserted at all: the caller frees
// it (the worker exports and advertises what its cache holds).
func (c *Cache) InsertFrom(seq engine.SeqID, hashes []kv.Hash, tokens int, source string) []engine.SeqID {
	return c.insert(seq, hashes, tokens, source, false)
}

// insert is InsertFrom; adopted counts the entry in Stats.Adopted (Adopt)
// instead of Inserts.
func (c *Cache) insert(seq engine.SeqID, hashes []kv.Hash, tokens int, source string, adopted bool) []engine.SeqID {
	if c == nil || len(hashes) == 0 || tokens > c.o.MaxTokens || tokens < len(hashes)*c.o.BlockTokens {
		return []engine.SeqID{seq}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n, held := chainMatch(c.byHash, (*entry).chain, hashes)
	if n == len(hashes) {
		c.lru.MoveToFront(held.el)
		return []engine.SeqID{seq}
	}
	var old []*entry
	for i := range n {
		for _, e := range c.byHash[hashes[i]] {
			if len(e.hashes) == i+1 && e.pins == 0 && slices.Equal(e.hashes, hashes[:i+1]) {
				old = append(old, e)
			}
		}
	}
	e := &entry{seq: seq, hashes: hashes, tokens: tokens, source: source}
	e.el = c.lru.PushFront(e)
	for _, h := range hashes {
		es := c.byHash[h]
		if len(es) == 0 && c.obs != nil {
			c.obs.Stored(h)
		}
		c.byHash[h] = append(es, e)
	}
	c.tokens += tokens
	if adopted {
		c.st.Adopted++
	} else {
		c.st.Inserts++
	}
	// The superseded go after e came in: their blocks stay held
	// throughout, so an Observer sees no removal and re-store of them.
	var free []engine.SeqID
	for _, o := range old {
		c.st.Superseded++
		free = append(free, c.dropLocked(o))
	}
	return append(free, c.trimLocked()...)
}

// Trim evicts least recently used unpinned entries until the bounds hold
// and returns their sequences, for the caller to Free under its engine
// lock.
func (c *Cache) Trim() []engine.SeqID {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.trimLocked()
}

func (c *Cache) trimLocked() []engine.SeqID {
	var free []engine.SeqID
	for el := c.lru.Back(); el != nil && (c.tokens > c.o.MaxTokens || c.lru.Len() > c.o.MaxEntries); {
		e := el.Value.(*entry)
		el = el.Prev()
		if e.pins > 0 {
			continue
		}
		c.st.Evictions++
		c.markSpillLocked(e)
		free = append(free, c.dropLocked(e))
	}
	return free
}

// Reclaim evicts least recently used unpinned entries until they held at
// least tokens KV tokens, or none is left, and returns their sequences for
// the caller to Free under its engine lock: a worker whose requests and
// cache share one KV pool gives a request the room its cached, unused
// prefixes take. Evictions count as Reclaims.
func (c *Cache) Reclaim(tokens int) []engine.SeqID { return c.Shrink(tokens, 0) }

// Shrink evicts least recently used unpinned entries until they held at
// least tokens KV tokens and numbered at least entries, or none is left,
// and returns their sequences for the caller to Free under its engine
// lock: a live sequence that needs engine memory (tokens) or a sequence
// slot (entries) takes it from the cache. Evictions count as Reclaims.
func (c *Cache) Shrink(tokens, entries int) []engine.SeqID {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var free []engine.SeqID
	for el := c.lru.Back(); el != nil && (tokens > 0 || entries > 0); {
		e := el.Value.(*entry)
		el = el.Prev()
		if e.pins > 0 {
			continue
		}
		c.st.Reclaims++
		tokens -= e.tokens
		entries--
		c.markSpillLocked(e)
		free = append(free, c.dropLocked(e))
	}
	return free
}

// Drain drops every unpinned entry and returns their sequences (a worker
// stopping, or freeing engine room); none goes to the host tier, and the
// evicted sequences not yet freed with Free will not either. The disk
// tier is emptied and its directory removed: a worker drains when it
// stops.
func (c *Cache) Drain() []engine.SeqID {
	if c == nil {
		return nil
	}
	// The disk tier goes with the worker: its files are removed (a
	// failure is counted in its stats).
	_ = c.host.Disk().clear()
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.spill)
	var free []engine.SeqID
	for el := c.lru.Front(); el != nil; {
		e := el.Value.(*entry)
		el = el.Next()
		if e.pins == 0 {
			free = append(free, c.dropLocked(e))
		}
	}
	return free
}

// DropSource drops every unpinned entry whose KV came from source (a
// peer's identity, not ""), in the engine and host tiers, and returns the
// engine sequences for the caller to Free under its engine lock (none is
// copied to the host tier): a peer whose pulled KV failed a spot check
// is no longer trusted for what it sent before. The entries dropped count
// in Stats.Peer.Purged. A pinned entry stays (its fork or export is under
// way) until the bounds evict it.
func (c *Cache) DropSource(source string) []engine.SeqID {
	if c == nil || source == "" {
		return nil
	}
	c.mu.Lock()
	var free []engine.SeqID
	for el := c.lru.Front(); el != nil; {
		e := el.Value.(*entry)
		el = el.Next()
		if e.source == source && e.pins == 0 {
			free = append(free, c.dropLocked(e))
		}
	}
	c.st.Peer.Purged += uint64(len(free))
	c.mu.Unlock()
	// After c.mu: both locks stay leaves.
	n := c.host.dropSource(source)
	c.mu.Lock()
	c.st.Peer.Purged += uint64(n)
	c.mu.Unlock()
	return free
}

// markSpillLocked records evicted e for Free to copy into the host tier.
func (c *Cache) markSpillLocked(e *entry) {
	if c.host != nil {
		c.spill[e.seq] = e
	}
}

// dropLocked removes unpinned e from the index and returns its sequence.
func (c *Cache) dropLocked(e *entry) engine.SeqID {
	c.lru.Remove(e.el)
	for _, h := range e.hashes {
		es := c.byHash[h]
		for i, x := range es {
			if x == e {
				es = append(es[:i], es[i+1:]...)
				break
			}
		}
		if len(es) == 0 {
			delete(c.byHash, h)
			if c.obs != nil {
				c.obs.Removed(h)
			}
		} else {
			c.byHash[h] = es
		}
	}
	c.tokens -= e.tokens
	return e.seq
}

// Digest returns at most n cached block hashes for a heartbeat: entries
// most recently used first, each from its first block on, each hash once.
// The caller owns the slice; nil when nothing is cached.
func (c *Cache) Digest(n int) []uint64 {
	if c == nil || n <= 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []uint64
	seen := make(map[kv.Hash]bool)
	for el := c.lru.Front(); el != nil && len(out) < n; el = el.Next() {
		for _, h := range el.Value.(*entry).hashes {
			if len(out) == n {
				break
			}
			if !seen[h] {
				seen[h] = true
				out = append(out, uint64(h))
			}
		}
	}
	return out
}

// Tokens returns the KV tokens the cache holds now (0 for a nil cache).
func (c *Cache) Tokens() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tokens
}

// Reclaimable returns the KV tokens of its unpinned entries now: what
// Reclaim can give back (0 for a nil cache).
func (c *Cache) Reclaimable() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tokens - c.pinnedTokens
}

// Stats returns the counters and occupancy (zero for a nil cache).
func (c *Cache) Stats() Stats {
	if c == nil {
		return Stats{}
	}
	c.mu.Lock()
	st := c.st
	st.Tokens, st.Entries, st.Pinned = c.tokens, c.lru.Len(), c.pinned
	st.Reclaimable = c.tokens - c.pinnedTokens
	c.mu.Unlock()
	// After c.mu: both locks stay leaves.
	st.Host = c.host.Stats()
	st.Disk = c.host.Disk().Stats()
	return st
}
