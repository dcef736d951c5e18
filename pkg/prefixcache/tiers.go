package prefixcache

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// takeOver moves every entry out of the tier, and out of its disk tier,
// into a new Host that no cache uses (Cache.Handover), and closes this
// one: its observer is told of every block removed, and it takes no
// spill from now on (a budget of 0). The entries' KV is not copied: the
// new tier's entries share their layers and snapshots. The disk tier's
// files stay where they are; its index moves (Disk.takeOver). Nil for a
// nil tier.
func (h *Host) takeOver() *Host {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	m := newHost(h.budget, h.blockTokens)
	m.now = h.now
	all := h.idx.reset()
	for i := len(all) - 1; i >= 0; i-- { // least recently used first
		e := *all[i]
		e.el = nil
		m.idx.insert(&e)
	}
	h.budget = 0
	h.mu.Unlock()
	m.disk = h.disk.takeOver() // its own lock, not under the host's
	return m
}

// takeOver moves the tier's index and the ownership of its directory
// into a new Disk that no tier uses, and closes this one: its observer is
// told of every block removed, it writes nothing from now on (a budget
// of 0), and clear leaves the directory (the new Disk's now) alone. A
// read under way of an entry moved finds it dropped here. Nil for a nil
// tier.
func (d *Disk) takeOver() *Disk {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	m := &Disk{dir: d.dir, lock: d.lock, budget: d.budget, blockTokens: d.blockTokens, now: d.now, timeout: d.timeout, readFile: d.readFile, next: d.next}
	all := d.idx.reset()
	for i := len(all) - 1; i >= 0; i-- {
		e := *all[i]
		all[i].dropped = true
		e.el = nil
		m.idx.insert(&e)
	}
	d.dir, d.lock, d.budget = "", nil, 0
	return m
}

// adopt takes the entries of m, a tier another cache's Handover took over
// (takeOver), in as its own, keeping their recency, below its own
// (theirs are older: m's stopped first), and evicts for its budget; the
// evicted entries that hold bytes and no peer's KV go to its disk tier,
// as a spill's evictions do. m's disk tier goes to this tier's disk
// tier (Disk.adopt), or is removed when this tier has none. Counted in
// HostStats.Adopted. Errors: the disk tier's (what could not move is
// dropped; the rest is adopted).
func (h *Host) adopt(m *Host) error {
	if m == nil {
		return nil
	}
	if h == nil {
		return m.disk.clear()
	}
	var errs []error
	if h.disk == nil {
		errs = append(errs, m.disk.clear())
	} else {
		errs = append(errs, h.disk.adopt(m.disk))
	}
	all := m.idx.reset() // most recent first; m has no observer
	h.mu.Lock()
	// Older than every entry h holds: pushed in front, then moved behind
	// them, most recent of m's first.
	var evicted []*hostEntry
	for _, e := range all {
		if h.idx.depth(e.hashes) == len(e.hashes) {
			continue // held already, by a newer entry
		}
		e.el = nil
		superseded := h.idx.insert(e)
		h.st.Superseded += uint64(len(superseded))
		h.idx.lru.MoveToBack(e.el)
		h.st.Adopted++
	}
	evicted = h.idx.evict(h.budget)
	h.st.Evictions += uint64(len(evicted))
	h.mu.Unlock()
	for _, e := range evicted {
		if e.source == "" && e.snap == nil {
			errs = append(errs, h.disk.put(e))
		}
	}
	return errors.Join(errs...)
}

// adopt takes the entries of m, a tier another cache's Handover took over
// (takeOver), in as its own, older than its own, and removes m's
// directory: each entry's file is renamed into this tier's directory (the
// same Options.DiskDir, so the same file system: the KV is not copied),
// and the least recently used beyond the budget are removed. A file that
// cannot be renamed drops its entry (counted in HostStats.Failures).
// Errors: the renames' and the removal's, joined.
func (d *Disk) adopt(m *Disk) error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	all := m.idx.reset() // most recent first
	for _, e := range all {
		e.dropped = true
	}
	m.mu.Unlock()
	var errs []error
	var moved []*diskEntry
	for _, e := range all {
		d.mu.Lock()
		d.next++
		path := filepath.Join(d.dir, strconv.FormatUint(d.next, 10)+".kv")
		d.mu.Unlock()
		if err := os.Rename(e.path, path); err != nil {
			errs = append(errs, fmt.Errorf("prefixcache: disk tier: adopt: %w", err))
			d.mu.Lock()
			d.st.Failures++
			d.mu.Unlock()
			continue
		}
		ne := *e
		ne.path, ne.el, ne.dropped = path, nil, false
		moved = append(moved, &ne)
	}
	d.mu.Lock()
	var gone []string
	for _, e := range moved {
		if d.idx.depth(e.hashes) == len(e.hashes) {
			gone = append(gone, e.path) // held already, by a newer entry
			continue
		}
		for _, o := range d.idx.insert(e) {
			o.dropped = true
			gone = append(gone, o.path)
			d.st.Superseded++
		}
		d.idx.lru.MoveToBack(e.el)
		d.st.Adopted++
	}
	evicted := d.idx.evict(d.budget)
	d.st.Evictions += uint64(len(evicted))
	for _, o := range evicted {
		o.dropped = true
		gone = append(gone, o.path)
	}
	d.mu.Unlock()
	for _, p := range gone {
		_ = os.Remove(p)
	}
	errs = append(errs, m.clear())
	return errors.Join(errs...)
}
