package prefixcache

import (
	"container/list"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv"
)

// diskEntry is one host-tier entry written to a file: its layers'
// canonical KV, concatenated, layerBytes each.
type diskEntry struct {
	hashes     []kv.Hash
	tokens     int
	layers     int
	layerBytes int
	path       string
	bytes      int64 // tokens × the model's KVBytesPerToken
	el         *list.Element
	dropped    bool // no longer in the index
}

// Disk is the disk tier behind a Host: the entries the host tier evicts
// for its budget, written to files in a directory of their own (made in
// Options.DiskDir at New, removed by Cache.Drain) under a byte budget of
// the model's true KV size, LRU, an entry whose blocks a newer one holds
// dropped. Host.Load reads from it when it holds a prompt's prefix deeper
// than the host tier. Its methods are the Host's, which calls them: Spill
// and Load under the caller's engine lock, the index under a lock of its
// own (a leaf, never held across file I/O or an engine call). A nil *Disk
// holds nothing. Its blocks are observed (SetObserver) and listed
// (AppendBlocks) as the Host's are: the worker's disk-tier KV events.
type Disk struct {
	dir         string
	lock        *os.File // dir's lock file (dir + lockSuffix), flocked while the tier lives
	budget      int64
	blockTokens int
	now         func() time.Time

	mu   sync.Mutex
	idx  chains[*diskEntry] // its obs: told of every hash the tier gains or loses
	next uint64
	st   HostStats
}

var _ Blocks = (*Disk)(nil)

// SetObserver makes o (nil: nobody) the tier's observer from now on, as
// Host.SetObserver does: told of every block hash the tier starts and
// stops holding (writes, supersessions, evictions, entries whose file is
// gone, clear), in order, with the tier's lock held (o must return
// quickly and not call the tier). A no-op on a nil tier.
func (d *Disk) SetObserver(o Observer) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.idx.obs = o
}

// AppendBlocks appends every block hash the tier holds to dst and returns
// it, calling mark (when not nil) under the lock after gathering them, as
// Host.AppendBlocks does. A nil tier appends nothing.
func (d *Disk) AppendBlocks(dst []uint64, mark func()) []uint64 {
	if d == nil {
		if mark != nil {
			mark()
		}
		return dst
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	dst = d.idx.appendHashes(dst)
	if mark != nil {
		mark()
	}
	return dst
}

// The disk tier's own directories in Options.DiskDir are diskDirPrefix
// followed by a random suffix; beside each, the file of the same name
// with lockSuffix is flocked by its process while its tier lives (the
// kernel drops the lock when the process dies, however it dies).
const (
	diskDirPrefix = "pdserve-kv-"
	lockSuffix    = ".lock"
	// staleUnlocked is how old a directory without a lock file must be
	// before a new tier removes it: one that young may be another
	// process's, made a moment before its lock.
	staleUnlocked = time.Minute
)

// newDisk makes a directory of its own in dir for a tier of budget (> 0)
// bytes, after removing the directories of tiers whose process is gone (a
// worker killed without Drain), so that restarts do not fill the disk;
// live tiers of other processes sharing dir are left alone.
func newDisk(dir string, budget int64, blockTokens int) (*Disk, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("prefixcache: disk tier: %w", err)
	}
	removeStaleDisks(dir, time.Now())
	own, err := os.MkdirTemp(dir, diskDirPrefix)
	if err != nil {
		return nil, fmt.Errorf("prefixcache: disk tier: %w", err)
	}
	lock, err := os.OpenFile(own+lockSuffix, os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		if err = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			lock.Close()
		}
	}
	if err != nil {
		os.RemoveAll(own)
		os.Remove(own + lockSuffix)
		return nil, fmt.Errorf("prefixcache: disk tier: lock: %w", err)
	}
	return &Disk{dir: own, lock: lock, budget: budget, blockTokens: blockTokens, now: time.Now}, nil
}

// removeStaleDisks removes the tier directories in dir whose lock no
// process holds, and those without a lock file older than staleUnlocked
// at now. It is best effort: what it cannot read or remove it leaves.
func removeStaleDisks(dir string, now time.Time) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, ent := range ents {
		if !ent.IsDir() || !strings.HasPrefix(ent.Name(), diskDirPrefix) {
			continue
		}
		path := filepath.Join(dir, ent.Name())
		f, err := os.OpenFile(path+lockSuffix, os.O_RDWR, 0)
		if errors.Is(err, os.ErrNotExist) {
			if info, ierr := ent.Info(); ierr == nil && now.Sub(info.ModTime()) > staleUnlocked {
				os.RemoveAll(path)
			}
			continue
		}
		if err != nil {
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			// Its process is gone. The lock file goes last, held:
			// no new tier can take this name meanwhile (MkdirTemp
			// makes only new directories).
			if os.RemoveAll(path) == nil {
				os.Remove(path + lockSuffix)
			}
		}
		f.Close()
	}
}

// Dir returns the tier's own directory ("" for a nil tier).
func (d *Disk) Dir() string {
	if d == nil {
		return ""
	}
	return d.dir
}

// Match returns how many leading hashes the tier holds, changing nothing.
func (d *Disk) Match(hashes []kv.Hash) int {
	if d == nil {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.idx.depth(hashes)
}

// put writes e, an entry the host tier evicted, to a file and indexes it
// as the most recent entry; entries beyond the budget, and those whose
// blocks e holds, are dropped and their files removed. An entry larger
// than the budget, or whose blocks the tier holds already, is not
// written. Errors: the file's (the tier is then unchanged).
func (d *Disk) put(e *hostEntry) error {
	if d == nil || e.bytes > d.budget || len(e.layers) == 0 {
		return nil
	}
	d.mu.Lock()
	if d.idx.held(e.hashes) {
		d.st.SpillsSkipped++
		d.mu.Unlock()
		return nil
	}
	d.next++
	path := filepath.Join(d.dir, strconv.FormatUint(d.next, 10)+".kv")
	d.mu.Unlock()
	size := 0
	for _, l := range e.layers {
		size += len(l)
	}
	buf := make([]byte, 0, size)
	for _, l := range e.layers {
		if len(l) != len(e.layers[0]) {
			return fmt.Errorf("prefixcache: disk tier: layers of %d and %d bytes", len(e.layers[0]), len(l))
		}
		buf = append(buf, l...)
	}
	if err := os.WriteFile(path, buf, 0o600); err != nil {
		d.mu.Lock()
		d.st.Failures++
		d.mu.Unlock()
		_ = os.Remove(path)
		return fmt.Errorf("prefixcache: disk tier: %w", err)
	}
	de := &diskEntry{hashes: e.hashes, tokens: e.tokens, layers: len(e.layers), layerBytes: len(e.layers[0]), path: path, bytes: e.bytes}
	d.mu.Lock()
	gone := d.insertLocked(de)
	d.mu.Unlock()
	for _, p := range gone {
		_ = os.Remove(p) // a file already gone is what Remove would do
	}
	return nil
}

// insertLocked indexes e and returns the files of the entries it drops.
func (d *Disk) insertLocked(e *diskEntry) []string {
	d.st.Spills++
	var gone []string
	superseded := d.idx.insert(e)
	d.st.Superseded += uint64(len(superseded))
	evicted := d.idx.evict(d.budget)
	d.st.Evictions += uint64(len(evicted))
	for _, o := range append(superseded, evicted...) {
		o.dropped = true
		gone = append(gone, o.path)
	}
	return gone
}

// dropLocked removes e from the index and returns its file's path.
func (d *Disk) dropLocked(e *diskEntry) string {
	d.idx.drop(e)
	e.dropped = true
	return e.path
}

// load is Host.Load from the disk tier: the file of the entry holding the
// longest prefix of hashes (at most maxBlocks blocks) is read and its
// first blocks imported into seq. The time is the read's and the
// imports' wall time, plus the engine's modeled host-link time on an
// engine that models one. Errors: the file's (an entry whose file is
// gone is dropped) or the engine's.
func (d *Disk) load(eng engine.Engine, seq engine.SeqID, hashes []kv.Hash, maxBlocks int) (HostLoad, error) {
	d.mu.Lock()
	d.st.Lookups++
	n := d.idx.depth(hashes[:min(len(hashes), max(maxBlocks, 0))])
	if n == 0 {
		d.mu.Unlock()
		return HostLoad{}, nil
	}
	e := d.idx.newest(hashes[:n])
	d.mu.Unlock()

	fail := func(err error) (HostLoad, error) {
		d.mu.Lock()
		d.st.Failures++
		d.mu.Unlock()
		return HostLoad{}, fmt.Errorf("prefixcache: disk tier: seq %d: %w", seq, err)
	}
	t0 := d.now()
	data, err := d.read(e)
	if err != nil {
		return fail(err)
	}
	m := n * d.blockTokens
	size := e.bytes / int64(e.tokens) * int64(m)
	layers := make([][]byte, e.layers)
	for l := range layers {
		layers[l] = data[l*e.layerBytes : (l+1)*e.layerBytes]
	}
	if err := importPrefix(eng, seq, layers, e.tokens, m); err != nil {
		return fail(err)
	}
	took := d.now().Sub(t0)
	if hl, ok := eng.(engine.HostLinked); ok {
		took += hl.ChargeHostLoad(size)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.st.Hits++
	d.st.HitTokens += uint64(m)
	d.st.LoadTime += took
	return HostLoad{Tokens: m, Bytes: size, Took: took, Disk: true}, nil
}

// clear drops every entry, telling the observer, and removes the tier's
// directory.
func (d *Disk) clear() error {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	for _, e := range d.idx.reset() {
		e.dropped = true
	}
	lock := d.lock
	d.lock = nil
	d.mu.Unlock()
	err := os.RemoveAll(d.dir)
	if lock != nil {
		if err == nil {
			os.Remove(d.dir + lockSuffix)
		}
		lock.Close() // after the removal: a new tier must not take the directory while it is still there
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		d.mu.Lock()
		d.st.Failures++
		d.mu.Unlock()
		return fmt.Errorf("prefixcache: disk tier: %w", err)
	}
	return nil
}

// Stats returns the tier's counters and occupancy (zero for a nil tier).
func (d *Disk) Stats() HostStats {
	if d == nil {
		return HostStats{}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.st
	st.Bytes, st.Budget, st.Blocks, st.Entries = d.idx.bytes, d.budget, d.idx.blocks(), d.idx.entries()
	return st
}
