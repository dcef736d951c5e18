package control

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// KV events: a worker's prefix-cache block hashes stored and removed, in
// batches with a sequence number, and full snapshots, on
// "pdserve.kv.<role>.<id>" for its engine tier and
// "pdserve.kv.<role>.<id>.<tier>" for another tier (KVTierHost: host
// memory, KVTierDisk: disk), each tier a stream of its own (epoch, sequence, snapshots): a
// block's tier is its stream's. The payload is binary, little-endian:
//
//	byte 0      version (1)
//	byte 1      kind: 1 events, 2 snapshot part
//	bytes 2-9   epoch: random per publisher start; a new epoch restarts the sequence
//	bytes 10-17 seq: events: this batch's number (1, 2, ...); snapshot: the
//	            last batch the snapshot includes (0: none)
//	events      runs, each a uint32 (bit 31: removed, else stored; bits
//	            0-30: count > 0) and count uint64 hashes
//	snapshot    part (uint32), parts (uint32, > part), then uint64 hashes:
//	            the union of the parts 0..parts-1 of one seq is every block
//	            the cache held then
//
// Block hashes are the chained kv.HashBlocks values, uniformly random
// 64-bit words: they do not compress, so the encoding is plain.
const (
	kvPrefix = "pdserve.kv."
	// KVWildcard matches every KV event subject.
	KVWildcard = kvPrefix + ">"

	kvVersion      = 1
	kvKindEvents   = 1
	kvKindSnapshot = 2
	kvHeader       = 18
	kvSnapHeader   = kvHeader + 8
	kvRunRemoved   = 1 << 31
	kvRunMax       = kvRunRemoved - 1
)

// CmdKVSnapshot asks a worker for a full KV snapshot now (the coordinator
// saw a gap in its events).
const CmdKVSnapshot = "kv-snapshot"

// KVSubject returns "pdserve.kv.<role>.<id>".
func KVSubject(role, id string) string { return kvPrefix + role + "." + id }

// Tiers of a worker's prefix cache below its engine memory, as KV event
// subjects name them (KVTierSubject).
const (
	// KVTierHost is the host-memory tier (prefixcache.Host).
	KVTierHost = "host"
	// KVTierDisk is the disk tier behind it (prefixcache.Disk).
	KVTierDisk = "disk"
)

// kvTiers are the tiers that publish KV events: "" (the engine tier),
// KVTierHost and KVTierDisk.
var kvTiers = []string{"", KVTierHost, KVTierDisk}

// validKVTier reports whether tier is one of kvTiers.
func validKVTier(tier string) bool { return slices.Contains(kvTiers, tier) }

// KVTierSubject returns the subject of tier's KV events of worker id of
// role: KVSubject for the engine tier (""), "pdserve.kv.<role>.<id>.<tier>"
// for another.
func KVTierSubject(role, id, tier string) string {
	if tier == "" {
		return KVSubject(role, id)
	}
	return KVSubject(role, id) + "." + tier
}

// Defaults of KVOptions.
const (
	DefaultKVFlushInterval    = 50 * time.Millisecond
	DefaultKVSnapshotInterval = 10 * time.Second
	DefaultKVBatchHashes      = 4096
	// kvMaxQueued bounds the event batches waiting for the next flush;
	// beyond it the oldest is dropped (the receiver sees the gap and
	// heals at the next snapshot).
	kvMaxQueued = 64
	// kvMaxPartHashes bounds a snapshot part (512 KiB of hashes) below
	// nats-server's default 1 MiB payload.
	kvMaxPartHashes = 1 << 16
)

// KVOptions configure a KVPublisher.
type KVOptions struct {
	// FlushInterval is how often pending events are published; > 0.
	FlushInterval time.Duration
	// SnapshotInterval is how often a full snapshot is published; > 0.
	SnapshotInterval time.Duration
	// BatchHashes is the most hashes of one events message: a batch
	// that reaches it is published before the next flush; > 0.
	BatchHashes int
}

// DefaultKVOptions returns 50 ms flushes, 10 s snapshots and batches of
// at most 4096 hashes (32 KiB).
func DefaultKVOptions() KVOptions {
	return KVOptions{FlushInterval: DefaultKVFlushInterval, SnapshotInterval: DefaultKVSnapshotInterval, BatchHashes: DefaultKVBatchHashes}
}

// Validate reports every invalid field in one error.
func (o KVOptions) Validate() error {
	var errs []error
	if o.FlushInterval <= 0 {
		errs = append(errs, fmt.Errorf("kv events flush interval %v must be positive", o.FlushInterval))
	}
	if o.SnapshotInterval <= 0 {
		errs = append(errs, fmt.Errorf("kv-snapshot-interval %v must be positive", o.SnapshotInterval))
	}
	if o.BatchHashes <= 0 {
		errs = append(errs, fmt.Errorf("kv events batch %d hashes must be positive", o.BatchHashes))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("control: %w", err)
	}
	return nil
}

// KVPublisher publishes one worker's prefix-cache blocks: Stored and
// Removed (a prefixcache.Observer's reports) are batched and published
// every FlushInterval with consecutive sequence numbers, and a snapshot
// of every block (from the blocks function) at Run's start, every
// SnapshotInterval and after RequestSnapshot. Stored, Removed and
// RequestSnapshot never block on NATS: they buffer, and Run publishes.
// Safe for concurrent use.
type KVPublisher struct {
	nc      *nats.Conn
	subject string
	o       KVOptions
	epoch   uint64
	blocks  func(dst []uint64, mark func()) []uint64

	mu     sync.Mutex
	cur    []byte // the batch being built, header space first
	curN   int    // hashes in cur
	runAt  int    // offset of cur's last run header; -1: no run yet
	runRem bool   // whether cur's last run is of removals
	queued [][]byte
	seq    uint64 // the last batch number given
	lost   uint64 // batches dropped for a full queue

	kick chan struct{} // a batch is full
	snap chan struct{} // a snapshot was asked for
	// snapBuf is Run's reusable snapshot list.
	snapBuf []uint64
}

// NewKVPublisher returns a publisher of the KV events of worker id of
// role on nc. blocks appends every block the cache holds to dst and calls
// mark while no report can come between its list and mark
// (prefixcache.Cache.AppendBlocks). Errors: ErrBadToken (role, id), an
// invalid o, wrapped.
func NewKVPublisher(nc *nats.Conn, role, id string, o KVOptions, blocks func(dst []uint64, mark func()) []uint64) (*KVPublisher, error) {
	return NewKVTierPublisher(nc, role, id, "", o, blocks)
}

// NewKVTierPublisher is NewKVPublisher for the blocks of one tier of the
// worker's cache: "" (the engine tier, as NewKVPublisher), KVTierHost or
// KVTierDisk, on KVTierSubject. Errors: as NewKVPublisher's, and an
// unknown tier.
func NewKVTierPublisher(nc *nats.Conn, role, id, tier string, o KVOptions, blocks func(dst []uint64, mark func()) []uint64) (*KVPublisher, error) {
	if !validKVTier(tier) {
		return nil, fmt.Errorf("control: kv events: unknown tier %q", tier)
	}
	if err := ValidToken(role); err != nil {
		return nil, fmt.Errorf("control: kv events: role: %w", err)
	}
	if err := ValidToken(id); err != nil {
		return nil, fmt.Errorf("control: kv events: id: %w", err)
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var e [8]byte
	_, _ = rand.Read(e[:]) // crypto/rand.Read never fails
	p := &KVPublisher{nc: nc, subject: KVTierSubject(role, id, tier), o: o, epoch: binary.LittleEndian.Uint64(e[:]), blocks: blocks,
		runAt: -1, kick: make(chan struct{}, 1), snap: make(chan struct{}, 1)}
	p.cur = p.newBatch()
	return p, nil
}

func (p *KVPublisher) newBatch() []byte {
	return make([]byte, kvHeader, kvHeader+min(p.o.BatchHashes, 512)*8+8)
}

// Stored records that the cache holds h now.
func (p *KVPublisher) Stored(h uint64) { p.add(h, false) }

// Removed records that the cache no longer holds h.
func (p *KVPublisher) Removed(h uint64) { p.add(h, true) }

func (p *KVPublisher) add(h uint64, removed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.runAt < 0 || p.runRem != removed || binary.LittleEndian.Uint32(p.cur[p.runAt:])&kvRunMax == kvRunMax {
		p.runAt, p.runRem = len(p.cur), removed
		var hdr uint32
		if removed {
			hdr = kvRunRemoved
		}
		p.cur = binary.LittleEndian.AppendUint32(p.cur, hdr)
	}
	p.cur = binary.LittleEndian.AppendUint64(p.cur, h)
	binary.LittleEndian.PutUint32(p.cur[p.runAt:], binary.LittleEndian.Uint32(p.cur[p.runAt:])+1)
	p.curN++
	if p.curN >= p.o.BatchHashes {
		p.cutLocked()
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

// cutLocked closes the batch being built, if it holds any hash, as the
// next sequence number and queues it.
func (p *KVPublisher) cutLocked() {
	if p.curN == 0 {
		return
	}
	p.seq++
	putKVHeader(p.cur, kvKindEvents, p.epoch, p.seq)
	if len(p.queued) == kvMaxQueued {
		p.queued = p.queued[1:]
		p.lost++
	}
	p.queued = append(p.queued, p.cur)
	p.cur, p.curN, p.runAt = p.newBatch(), 0, -1
}

func putKVHeader(b []byte, kind byte, epoch, seq uint64) {
	b[0], b[1] = kvVersion, kind
	binary.LittleEndian.PutUint64(b[2:], epoch)
	binary.LittleEndian.PutUint64(b[10:], seq)
}

// RequestSnapshot makes Run publish a snapshot soon (a CmdKVSnapshot).
func (p *KVPublisher) RequestSnapshot() {
	select {
	case p.snap <- struct{}{}:
	default:
	}
}

// KVPublisherStats are a publisher's counters since it was made.
type KVPublisherStats struct {
	Seq  uint64 // the last batch number given
	Lost uint64 // batches dropped unpublished for a full queue
}

// Stats returns the publisher's counters.
func (p *KVPublisher) Stats() KVPublisherStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return KVPublisherStats{Seq: p.seq, Lost: p.lost}
}

// Run publishes a snapshot at once, the pending events every
// FlushInterval (and as soon as a batch is full), and a snapshot every
// SnapshotInterval and after RequestSnapshot, until ctx ends; then it
// publishes the pending events and returns nil. While nc is not connected
// nothing is published: the batches of that time are lost, which the
// receiver sees as a gap that the next snapshot heals. Errors: publish
// errors other than a full reconnect buffer, wrapped; none once ctx has
// ended.
func (p *KVPublisher) Run(ctx context.Context) error {
	flush := time.NewTicker(p.o.FlushInterval)
	defer flush.Stop()
	snap := time.NewTicker(p.o.SnapshotInterval)
	defer snap.Stop()
	err := p.snapshot()
	for err == nil {
		select {
		case <-ctx.Done():
			_ = p.flush()
			return nil
		case <-flush.C:
			err = p.flush()
		case <-p.kick:
			err = p.flush()
		case <-snap.C:
			err = p.snapshot()
		case <-p.snap:
			err = p.snapshot()
			snap.Reset(p.o.SnapshotInterval)
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// flush publishes the queued batches and the one being built.
func (p *KVPublisher) flush() error {
	p.mu.Lock()
	p.cutLocked()
	q := p.queued
	p.queued = nil
	p.mu.Unlock()
	for _, m := range q {
		if err := p.publish(m); err != nil {
			return err
		}
	}
	return nil
}

func (p *KVPublisher) publish(m []byte) error {
	if !p.nc.IsConnected() {
		return nil
	}
	if err := p.nc.Publish(p.subject, m); err != nil && !errors.Is(err, nats.ErrReconnectBufExceeded) {
		return fmt.Errorf("control: publish kv events on %s: %w", p.subject, err)
	}
	return nil
}

// snapshot publishes the events up to now and then every block the cache
// holds, as of the last of those batches.
func (p *KVPublisher) snapshot() error {
	var seq uint64
	var q [][]byte
	p.snapBuf = p.blocks(p.snapBuf[:0], func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.cutLocked()
		seq, q, p.queued = p.seq, p.queued, nil
	})
	for _, m := range q {
		if err := p.publish(m); err != nil {
			return err
		}
	}
	per := kvMaxPartHashes
	if mp := p.nc.MaxPayload(); mp > 0 {
		per = min(per, int(mp-kvSnapHeader)/8)
	}
	hs := p.snapBuf
	parts := max((len(hs)+per-1)/per, 1)
	buf := make([]byte, 0, kvSnapHeader+min(len(hs), per)*8)
	for i := range parts {
		chunk := hs[min(i*per, len(hs)):min((i+1)*per, len(hs))]
		buf = encodeSnapshotPart(buf[:0], p.epoch, seq, i, parts, chunk)
		if err := p.publish(buf); err != nil {
			return err
		}
	}
	return nil
}

// encodeSnapshotPart appends part of parts of a snapshot to dst.
func encodeSnapshotPart(dst []byte, epoch, seq uint64, part, parts int, hs []uint64) []byte {
	dst = append(dst, make([]byte, kvHeader)...)
	putKVHeader(dst[len(dst)-kvHeader:], kvKindSnapshot, epoch, seq)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(part))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(parts))
	for _, h := range hs {
		dst = binary.LittleEndian.AppendUint64(dst, h)
	}
	return dst
}

// ErrBadKVMessage: a KV events payload that does not decode.
var ErrBadKVMessage = errors.New("control: invalid kv events message")

// kvMessage is a decoded KV payload; body aliases the payload.
type kvMessage struct {
	kind        byte
	epoch, seq  uint64
	part, parts int
	body        []byte // events: runs; snapshot: hashes
}

// decodeKV checks and decodes data. Errors: ErrBadKVMessage, wrapped.
func decodeKV(data []byte) (kvMessage, error) {
	var m kvMessage
	if len(data) < kvHeader {
		return m, fmt.Errorf("%w: %d bytes", ErrBadKVMessage, len(data))
	}
	if data[0] != kvVersion {
		return m, fmt.Errorf("%w: version %d (want %d)", ErrBadKVMessage, data[0], kvVersion)
	}
	m.kind = data[1]
	m.epoch = binary.LittleEndian.Uint64(data[2:])
	m.seq = binary.LittleEndian.Uint64(data[10:])
	switch m.kind {
	case kvKindEvents:
		m.body = data[kvHeader:]
		for b := m.body; len(b) > 0; {
			if len(b) < 4 {
				return m, fmt.Errorf("%w: a run header cut short", ErrBadKVMessage)
			}
			n := int(binary.LittleEndian.Uint32(b) & kvRunMax)
			if n == 0 || len(b)-4 < n*8 {
				return m, fmt.Errorf("%w: a run of %d hashes in %d bytes", ErrBadKVMessage, n, len(b)-4)
			}
			b = b[4+n*8:]
		}
		if len(m.body) == 0 {
			return m, fmt.Errorf("%w: events without a run", ErrBadKVMessage)
		}
	case kvKindSnapshot:
		if len(data) < kvSnapHeader || (len(data)-kvSnapHeader)%8 != 0 {
			return m, fmt.Errorf("%w: a snapshot part of %d bytes", ErrBadKVMessage, len(data))
		}
		m.part = int(binary.LittleEndian.Uint32(data[kvHeader:]))
		m.parts = int(binary.LittleEndian.Uint32(data[kvHeader+4:]))
		if m.part >= m.parts {
			return m, fmt.Errorf("%w: snapshot part %d of %d", ErrBadKVMessage, m.part, m.parts)
		}
		m.body = data[kvSnapHeader:]
	default:
		return m, fmt.Errorf("%w: kind %d", ErrBadKVMessage, m.kind)
	}
	return m, nil
}

// eachEvent calls f for each hash of an events body, in order.
func eachEvent(body []byte, f func(h uint64, removed bool)) {
	for len(body) > 0 {
		hdr := binary.LittleEndian.Uint32(body)
		n := int(hdr & kvRunMax)
		rem := hdr&kvRunRemoved != 0
		for i := range n {
			f(binary.LittleEndian.Uint64(body[4+i*8:]), rem)
		}
		body = body[4+n*8:]
	}
}
