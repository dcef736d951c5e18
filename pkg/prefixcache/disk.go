package prefixcache

import (
	"container/list"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
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
// dropped. Cache.ReadDisk reads a prompt's prefix from it, off the
// engine lock, when it holds more of it than the other tiers, and
// Host.Load imports that read. Its methods are the Host's and the
// Cache's, which call them: Spill under the caller's engine lock (it
// writes the files the host tier evicts), reads without it, the index
// under a lock of its own (a leaf, never held across file I/O or an
// engine call). A nil *Disk
// holds nothing. Its blocks are observed (SetObserver) and listed
// (AppendBlocks) as the Host's are: the worker's disk-tier KV events.
type Disk struct {
	dir         string
	lock        *os.File // dir's lock file (dir + lockSuffix), flocked while the tier lives
	budget      int64
	blockTokens int
	now         func() time.Time
	// timeout bounds a read of an entry's file (DiskReadTimeout).
	timeout time.Duration
	// readFile reads an entry's file (readEntryFile; tests replace it).
	readFile func(path string, size int64) ([]byte, error)

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
	return &Disk{dir: own, lock: lock, budget: budget, blockTokens: blockTokens, now: time.Now, timeout: DiskReadTimeout, readFile: readEntryFile}, nil
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
	if d == nil || len(e.layers) == 0 {
		return nil
	}
	d.mu.Lock()
	if e.bytes > d.budget { // 0 once taken over
		d.mu.Unlock()
		return nil
	}
	if d.idx.held(e.hashes) {
		d.st.SpillsSkipped++
		d.mu.Unlock()
		return nil
	}
	d.next++
	path := filepath.Join(d.dir, strconv.FormatUint(d.next, 10)+".kv")
	d.mu.Unlock()
	layerBytes := len(e.layers[0])
	for _, l := range e.layers {
		if len(l) != layerBytes {
			return fmt.Errorf("prefixcache: disk tier: layers of %d and %d bytes", layerBytes, len(l))
		}
	}
	de := &diskEntry{hashes: e.hashes, tokens: e.tokens, layers: len(e.layers), layerBytes: layerBytes, path: path, bytes: e.bytes}
	buf := make([]byte, diskHeaderBytes, de.fileBytes())
	for _, l := range e.layers {
		buf = append(buf, l...)
	}
	de.seal(buf)
	if err := writeEntryFile(path, buf); err != nil {
		d.mu.Lock()
		d.st.Failures++
		d.mu.Unlock()
		_ = os.Remove(path)
		return fmt.Errorf("prefixcache: disk tier: %w", err)
	}
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

// DiskRead is a disk-tier entry read from its file and checked, off the
// engine lock (Cache.ReadDisk), for Host.Load to import under it: the
// engine lock is never held across file I/O. Its bytes belong to it; it
// is used once.
type DiskRead struct {
	hashes []kv.Hash // the entry's blocks
	tokens int       // the entry's tokens: len(hashes) × BlockTokens
	layers [][]byte  // per layer, the canonical KV of tokens [0, tokens)
	bytes  int64     // tokens × the model's KVBytesPerToken
	took   time.Duration
}

// depth returns how many leading hashes r holds (0 for a nil read).
func (r *DiskRead) depth(hashes []kv.Hash) int {
	if r == nil {
		return 0
	}
	n := 0
	for n < min(len(hashes), len(r.hashes)) && hashes[n] == r.hashes[n] {
		n++
	}
	return n
}

// DiskReadTimeout bounds the read of one disk-tier file: a read that
// takes longer is given up (counted as a failure) and the prefix
// computed. The read runs off the engine lock, so it delays only the
// request that waits for it.
const DiskReadTimeout = 5 * time.Second

// errBadEntry marks a disk-tier file that is not what its entry wrote:
// not a regular file (a FIFO, a device, a symbolic link), of another
// size, or whose header or checksum does not match.
var errBadEntry = errors.New("bad entry file")

// readEntry reads and checks the longest prefix of hashes the tier holds,
// at most maxBlocks blocks, off the engine lock, giving up after the
// tier's timeout or when ctx ends. It returns nil on a miss. A bad entry
// is dropped, its file removed and counted (HostStats.BadEntries); an
// entry whose file is gone is dropped. Errors: the file's, errBadEntry,
// the timeout or ctx's.
func (d *Disk) readEntry(ctx context.Context, hashes []kv.Hash, maxBlocks int) (*DiskRead, error) {
	d.mu.Lock()
	n := d.idx.depth(hashes[:min(len(hashes), max(maxBlocks, 0))])
	if n == 0 {
		d.mu.Unlock()
		return nil, nil
	}
	e := d.idx.newest(hashes[:n])
	d.mu.Unlock()
	t0 := d.now()
	payload, err := d.read(ctx, e)
	if err != nil {
		return nil, err
	}
	r := &DiskRead{hashes: e.hashes, tokens: e.tokens, layers: make([][]byte, e.layers), bytes: e.bytes, took: d.now().Sub(t0)}
	for l := range r.layers {
		r.layers[l] = payload[l*e.layerBytes : (l+1)*e.layerBytes]
	}
	return r, nil
}

// read returns the payload of e's file (its layers' bytes), read off the
// engine lock within the tier's timeout and checked against e: a
// regular file (opened without following a symbolic link) of e's size,
// whose header names e and whose checksum matches. A bad or missing file
// drops e (a bad one is removed and counted). A read still blocked at the
// timeout is left to end on its own goroutine; its result is dropped.
func (d *Disk) read(ctx context.Context, e *diskEntry) ([]byte, error) {
	type result struct {
		data []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		data, err := d.readFile(e.path, e.fileBytes())
		done <- result{data, err}
	}()
	t := time.NewTimer(d.timeout)
	defer t.Stop()
	var res result
	select {
	case res = <-done:
	case <-t.C:
		res.err = fmt.Errorf("%s: read gave up after %v", e.path, d.timeout)
	case <-ctx.Done():
		res.err = fmt.Errorf("%s: %w", e.path, context.Cause(ctx))
	}
	if res.err == nil {
		res.err = e.verify(res.data)
	}
	if res.err == nil {
		return res.data[diskHeaderBytes:], nil
	}
	bad, gone := errors.Is(res.err, errBadEntry), errors.Is(res.err, os.ErrNotExist)
	d.mu.Lock()
	if !e.dropped && (bad || gone) {
		d.dropLocked(e)
	}
	if bad {
		d.st.BadEntries++
	} else {
		d.st.Failures++
	}
	d.mu.Unlock()
	if bad {
		_ = os.Remove(e.path) // ours, whatever was put in its place
	}
	return nil, res.err
}

// loadRead is Host.Load from the disk tier: the first blocks of r, an
// entry ReadDisk read, imported into seq, at most maxBlocks of those
// hashes holds. The time is the read's and the imports' wall time, plus
// the engine's modeled host-link time on an engine that models one.
// Errors: the engine's.
func (d *Disk) loadRead(eng engine.Engine, seq engine.SeqID, r *DiskRead, hashes []kv.Hash, maxBlocks int) (HostLoad, error) {
	d.mu.Lock()
	d.st.Lookups++
	d.mu.Unlock()
	n := r.depth(hashes[:min(len(hashes), max(maxBlocks, 0))])
	if n == 0 {
		return HostLoad{}, nil
	}
	m := n * d.blockTokens
	size := r.bytes / int64(r.tokens) * int64(m)
	t0 := d.now()
	if err := importPrefix(eng, seq, r.layers, r.tokens, m); err != nil {
		d.mu.Lock()
		d.st.Failures++
		d.mu.Unlock()
		return HostLoad{}, fmt.Errorf("prefixcache: disk tier: seq %d: %w", seq, err)
	}
	took := r.took + d.now().Sub(t0)
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

// An entry's file is a header of diskHeaderBytes, then its layers' bytes:
//
//	magic      8 bytes  diskMagic (the format's version)
//	tokens     4 bytes  little-endian, the entry's
//	layers     4 bytes
//	layerBytes 4 bytes
//	blocks     4 bytes  len(hashes)
//	last hash  8 bytes  the chain hash of its last block (names the prefix)
//	checksum   4 bytes  CRC-32C of the header's first 32 bytes, every
//	                    block hash (8 bytes each, little-endian) and the
//	                    layers' bytes
//
// The checksum binds the bytes to the entry they were written for (a file
// of another prefix, or noise of the same size, fails it); it detects,
// not authenticates: whoever can write the directory can write a valid
// file. A MAC under a per-deployment secret (HMAC-SHA-256 of the same
// input) takes its place in a format of its own magic, with a wider tag.
const (
	diskMagic       = "PDKVc32\x00"
	diskHeaderBytes = 36
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// fileBytes is the size of e's file.
func (e *diskEntry) fileBytes() int64 {
	return diskHeaderBytes + int64(e.layers)*int64(e.layerBytes)
}

// sum returns the checksum of file, e's header and payload (the
// checksum's own field is not read).
func (e *diskEntry) sum(file []byte) uint32 {
	c := crc32.Update(0, castagnoli, file[:32])
	var b [8]byte
	for _, h := range e.hashes {
		binary.LittleEndian.PutUint64(b[:], uint64(h))
		c = crc32.Update(c, castagnoli, b[:])
	}
	return crc32.Update(c, castagnoli, file[diskHeaderBytes:])
}

// seal fills in file's header for e (the payload follows it).
func (e *diskEntry) seal(file []byte) {
	copy(file, diskMagic)
	binary.LittleEndian.PutUint32(file[8:], uint32(e.tokens))
	binary.LittleEndian.PutUint32(file[12:], uint32(e.layers))
	binary.LittleEndian.PutUint32(file[16:], uint32(e.layerBytes))
	binary.LittleEndian.PutUint32(file[20:], uint32(len(e.hashes)))
	binary.LittleEndian.PutUint64(file[24:], uint64(e.hashes[len(e.hashes)-1]))
	binary.LittleEndian.PutUint32(file[32:], e.sum(file))
}

// verify checks that file is what seal wrote for e. Errors: errBadEntry.
func (e *diskEntry) verify(file []byte) error {
	if int64(len(file)) != e.fileBytes() {
		return fmt.Errorf("%s: %d bytes, want %d: %w", e.path, len(file), e.fileBytes(), errBadEntry)
	}
	want := make([]byte, diskHeaderBytes)
	copy(want, file[:diskHeaderBytes])
	e.seal(want)
	if string(want[:32]) != string(file[:32]) {
		return fmt.Errorf("%s: header names another entry: %w", e.path, errBadEntry)
	}
	if got, sum := binary.LittleEndian.Uint32(file[32:]), e.sum(file); got != sum {
		return fmt.Errorf("%s: checksum %08x, want %08x: %w", e.path, got, sum, errBadEntry)
	}
	return nil
}

// writeEntryFile writes file to path, a new file: a name that exists (a
// symbolic link planted there included) is an error.
func writeEntryFile(path string, file []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(file); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// readEntryFile reads the file at path, which must be a regular file of
// size bytes: opened without following a symbolic link, and without
// blocking (a FIFO in its place opens at once, and fails the check),
// checked with fstat after the open. Errors: the open's or read's, or
// errBadEntry.
func readEntryFile(path string, size int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("%s: a symbolic link: %w", path, errBadEntry)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%v): %w", path, fi.Mode().Type(), errBadEntry)
	}
	if fi.Size() != size {
		return nil, fmt.Errorf("%s: %d bytes, want %d: %w", path, fi.Size(), size, errBadEntry)
	}
	data := make([]byte, size)
	if _, err := io.ReadFull(f, data); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: shorter than its size: %w", path, errBadEntry)
		}
		return nil, err
	}
	return data, nil
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
	lock, dir := d.lock, d.dir
	d.lock = nil
	d.mu.Unlock()
	if dir == "" {
		return nil // taken over (takeOver): the directory is another tier's
	}
	err := os.RemoveAll(dir)
	if lock != nil {
		if err == nil {
			os.Remove(dir + lockSuffix)
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
