package respstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Bucket is the name of the key-value bucket of stored responses.
const Bucket = "pdserve_responses"

// Errors of a Store; match with errors.Is.
var (
	// ErrNotFound: the owner has no response of that id (never made,
	// made by another owner, deleted, expired or lost by NATS).
	ErrNotFound = errors.New("respstore: response not found")
	// ErrTooLarge: a record over Limits.MaxValueBytes or
	// Limits.MaxBytesPerOwner.
	ErrTooLarge = errors.New("respstore: response too large to store")
)

// Limits bound the store.
type Limits struct {
	// TTL is how long a response is kept (the bucket's max age); > 0.
	TTL time.Duration
	// MaxBytes bounds the whole bucket (> 0).
	MaxBytes int64
	// MaxValueBytes bounds one record (> 0, at most MaxBytesPerOwner).
	MaxValueBytes int32
	// MaxPerOwner and MaxBytesPerOwner bound one owner's responses: a
	// Put beyond either evicts the owner's oldest first (> 0).
	MaxPerOwner      int
	MaxBytesPerOwner int64
	// Replicas of the bucket's stream (1 on a single NATS server, up to
	// 5 in a cluster).
	Replicas int
	// Memory keeps the bucket in memory rather than on the NATS server's
	// disk.
	Memory bool
}

// DefaultLimits are the coordinator's defaults: a day, 256 MiB in all,
// 4 MiB a response, 1,000 responses and 64 MiB per key, in memory.
func DefaultLimits() Limits {
	return Limits{TTL: 24 * time.Hour, MaxBytes: 256 << 20, MaxValueBytes: 4 << 20, MaxPerOwner: 1000,
		MaxBytesPerOwner: 64 << 20, Replicas: 1, Memory: true}
}

// Validate reports limits out of range.
func (l Limits) Validate() error {
	switch {
	case l.TTL <= 0:
		return errors.New("respstore: TTL must be > 0")
	case l.MaxBytes <= 0 || l.MaxValueBytes <= 0 || l.MaxPerOwner <= 0 || l.MaxBytesPerOwner <= 0:
		return errors.New("respstore: MaxBytes, MaxValueBytes, MaxPerOwner and MaxBytesPerOwner must be > 0")
	case int64(l.MaxValueBytes) > l.MaxBytesPerOwner || l.MaxBytesPerOwner > l.MaxBytes:
		return errors.New("respstore: want MaxValueBytes ≤ MaxBytesPerOwner ≤ MaxBytes")
	case l.Replicas < 1 || l.Replicas > 5:
		return errors.New("respstore: Replicas must be 1..5")
	}
	return nil
}

// Record is one stored response.
type Record struct {
	ID string `json:"id"`
	// CreatedAt is the response's created_at (Unix seconds).
	CreatedAt int64 `json:"created_at"`
	// Response is the Response object as the API returns it.
	Response json.RawMessage `json:"response"`
	// Input is the request's input items (the input_items route's data,
	// oldest first).
	Input json.RawMessage `json:"input"`
	// Conversation is what a continuation goes on from: the
	// conversation's messages up to and with this response's output
	// (the frontend's format).
	Conversation json.RawMessage `json:"conversation"`
}

// Store is the bucket. Safe for concurrent use.
type Store struct {
	lim Limits
	now func() time.Time
	nc  *nats.Conn

	mu sync.Mutex
	kv jetstream.KeyValue // nil until the bucket is open
}

// Subjects are the NATS subjects a client of the bucket publishes to
// (the JetStream API of its stream and its keys): the coordinator's NATS
// permissions.
func Subjects() []string {
	const stream = "KV_" + Bucket
	return []string{"$JS.API.INFO", "$JS.API.STREAM.INFO." + stream, "$JS.API.STREAM.CREATE." + stream, "$JS.API.STREAM.UPDATE." + stream,
		"$JS.API.STREAM.MSG.GET." + stream, "$JS.API.DIRECT.GET." + stream, "$JS.API.DIRECT.GET." + stream + ".>", "$KV." + Bucket + ".>"}
}

// New returns the Store of the bucket on nc's JetStream with lim; the
// bucket is created or updated by the first call that needs it, and
// again by each call while that fails (a NATS server not up yet).
// Errors: invalid limits.
func New(nc *nats.Conn, lim Limits) (*Store, error) {
	if err := lim.Validate(); err != nil {
		return nil, err
	}
	return &Store{nc: nc, lim: lim, now: time.Now}, nil
}

// Open is New and the bucket opened at once. Errors: New's;
// JetStream's (not enabled, no permission, the account's limits).
func Open(ctx context.Context, nc *nats.Conn, lim Limits) (*Store, error) {
	s, err := New(nc, lim)
	if err != nil {
		return nil, err
	}
	if _, err := s.bucket(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// bucket returns the open bucket, opening it first when needed.
func (s *Store) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kv != nil {
		return s.kv, nil
	}
	lim := s.lim
	js, err := jetstream.New(s.nc)
	if err != nil {
		return nil, fmt.Errorf("respstore: jetstream: %w", err)
	}
	cfg := jetstream.KeyValueConfig{Bucket: Bucket, Description: "pdserve stored responses", History: 1, TTL: lim.TTL,
		MaxBytes: lim.MaxBytes, MaxValueSize: lim.MaxValueBytes, Replicas: lim.Replicas, Storage: jetstream.FileStorage}
	if lim.Memory {
		cfg.Storage = jetstream.MemoryStorage
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("respstore: bucket %s: %w", Bucket, err)
	}
	s.kv = kv
	return kv, nil
}

// validToken matches an owner or id: what a key's token may hold.
var validToken = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

func key(owner, id string) (string, error) {
	if !validToken.MatchString(owner) || !validToken.MatchString(id) || id == "index" {
		return "", ErrNotFound
	}
	return owner + "." + id, nil
}

// indexEntry is one response of an owner's index.
type indexEntry struct {
	ID    string `json:"id"`
	Bytes int64  `json:"bytes"`
	At    int64  `json:"at"` // Unix nanoseconds of the Put
}

// casTries bounds the compare-and-set loop of an index update.
const casTries = 8

// Put stores rec for owner, evicting the owner's oldest responses beyond
// its bounds. Errors: ErrTooLarge, ErrNotFound for an owner or id that
// cannot be a key, NATS's.
func (s *Store) Put(ctx context.Context, owner string, rec Record) error {
	k, err := key(owner, rec.ID)
	if err != nil {
		return fmt.Errorf("respstore: put: invalid owner or id: %w", err)
	}
	val, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("respstore: put %s: %w", rec.ID, err)
	}
	if len(val) > int(s.lim.MaxValueBytes) {
		return fmt.Errorf("%w: %d bytes, over %d", ErrTooLarge, len(val), s.lim.MaxValueBytes)
	}
	kv, err := s.bucket(ctx)
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, k, val); err != nil {
		return fmt.Errorf("respstore: put %s: %w", rec.ID, err)
	}
	evicted, err := s.updateIndex(ctx, kv, owner, func(idx []indexEntry) []indexEntry {
		return append(idx, indexEntry{ID: rec.ID, Bytes: int64(len(val)), At: s.now().UnixNano()})
	})
	if err != nil {
		_ = kv.Delete(context.WithoutCancel(ctx), k)
		return fmt.Errorf("respstore: put %s: index: %w", rec.ID, err)
	}
	for _, id := range evicted {
		if ek, err := key(owner, id); err == nil {
			_ = kv.Delete(ctx, ek) // gone already, or dropped by the TTL
		}
	}
	return nil
}

// updateIndex applies change to owner's index, drops entries older than
// the TTL, and evicts the oldest beyond the owner's bounds, under
// compare-and-set; it returns the evicted ids.
func (s *Store) updateIndex(ctx context.Context, kv jetstream.KeyValue, owner string, change func([]indexEntry) []indexEntry) ([]string, error) {
	ik := owner + ".index"
	for range casTries {
		var idx []indexEntry
		var rev uint64
		e, err := kv.Get(ctx, ik)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return nil, err
		default:
			rev = e.Revision()
			if err := json.Unmarshal(e.Value(), &idx); err != nil {
				idx = nil // a corrupt index starts again; the TTL bounds what it lost track of
			}
		}
		idx = change(idx)
		var evicted []string
		cutoff := s.now().Add(-s.lim.TTL).UnixNano()
		var total int64
		for _, x := range idx {
			total += x.Bytes
		}
		slices.SortStableFunc(idx, func(a, b indexEntry) int { return cmpInt64(a.At, b.At) })
		for len(idx) > 0 && (idx[0].At < cutoff || len(idx) > s.lim.MaxPerOwner || total > s.lim.MaxBytesPerOwner) {
			evicted = append(evicted, idx[0].ID)
			total -= idx[0].Bytes
			idx = idx[1:]
		}
		val, err := json.Marshal(idx)
		if err != nil {
			return nil, err
		}
		if rev == 0 {
			_, err = kv.Create(ctx, ik, val)
		} else {
			_, err = kv.Update(ctx, ik, val, rev)
		}
		if err == nil {
			return evicted, nil
		}
		var apiErr *jetstream.APIError
		if !errors.Is(err, jetstream.ErrKeyExists) && !(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence) {
			return nil, err
		}
		// Another replica updated the index first: read it again.
	}
	return nil, errors.New("respstore: the index changed under every try")
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Get returns owner's response id. Errors: ErrNotFound, NATS's.
func (s *Store) Get(ctx context.Context, owner, id string) (*Record, error) {
	k, err := key(owner, id)
	if err != nil {
		return nil, err
	}
	kv, err := s.bucket(ctx)
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, k)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return nil, ErrNotFound
	case err != nil:
		return nil, fmt.Errorf("respstore: get %s: %w", id, err)
	}
	var rec Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.ID != id {
		return nil, ErrNotFound // not a record of ours: never a wrong continuation
	}
	return &rec, nil
}

// Delete removes owner's response id. Errors: ErrNotFound, NATS's.
func (s *Store) Delete(ctx context.Context, owner, id string) error {
	if _, err := s.Get(ctx, owner, id); err != nil {
		return err
	}
	k, _ := key(owner, id)
	kv, err := s.bucket(ctx)
	if err != nil {
		return err
	}
	if err := kv.Purge(ctx, k); err != nil {
		return fmt.Errorf("respstore: delete %s: %w", id, err)
	}
	_, err = s.updateIndex(ctx, kv, owner, func(idx []indexEntry) []indexEntry {
		return slices.DeleteFunc(idx, func(x indexEntry) bool { return x.ID == id })
	})
	if err != nil {
		return fmt.Errorf("respstore: delete %s: index: %w", id, err)
	}
	return nil
}
