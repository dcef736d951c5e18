package apikey

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Key is an authenticated key: what the frontend knows of the client
// presenting it. Safe for concurrent use; the requests presenting one key
// share its buckets.
type Key struct {
	// Name is the entry's Label: its name, or "sha256:" and the first 8
	// hex digits of its digest.
	Name string
	// Prefix is the first 8 hex digits of the key's SHA-256, for logs.
	Prefix string
	digest [sha256.Size]byte
	tenant string
	lim    *limiter
}

// Tenant returns the key's prefix-cache partition: "tenant:" and the key
// file's tenant=, which keys naming the same tenant share (an explicit
// shared namespace, e.g. for a public system prompt), else "key:" and the
// key's digest in hex, a partition of its own. Requests of different
// partitions never hit each other's cached prefixes, so a hit tells a
// client nothing of what another asked. Secret: it is hashed into the
// cache's chain root, never logged.
func (k *Key) Tenant() string {
	if k.tenant != "" {
		return "tenant:" + k.tenant
	}
	return "key:" + hex.EncodeToString(k.digest[:])
}

// Digest returns the SHA-256 of the key: what tells one key from
// another (two keys may share a Name).
func (k *Key) Digest() [sha256.Size]byte { return k.digest }

// Limits returns the key's requests and tokens a minute; 0: no limit.
func (k *Key) Limits() (rpm, tpm int) { return k.lim.limits() }

// TakeRequest takes one request from the key's requests-a-minute bucket
// at now. The Quota says whether it did and how both limits stand.
func (k *Key) TakeRequest(now time.Time) Quota { return k.lim.take(now, Requests, 1) }

// TakeTokens takes n tokens from the key's tokens-a-minute bucket at now,
// all or none.
func (k *Key) TakeTokens(now time.Time, n int) Quota { return k.lim.take(now, Tokens, n) }

// SettleTokens settles at now the charge of a request that took taken
// tokens before it ran (TakeTokens) and used used: it gives back
// taken − used, or takes used − taken more, never refused, into debt
// (see the package doc). Negative counts are taken as 0.
func (k *Key) SettleTokens(now time.Time, taken, used int) {
	k.lim.settle(now, int64(max(used, 0))-int64(max(taken, 0)))
}

// Keys is the reloadable set of keys of a key file. Safe for concurrent
// use.
type Keys struct {
	file watched
	cur  atomic.Pointer[keySet]
	// emptySince: when an unforced reload first read a file without keys
	// and left the keys as they were (see reload), zero when the last one
	// did not. Guarded by file.mu.
	emptySince time.Time
	// now is the clock of emptySince (time.Now; tests set another).
	now func() time.Time
}

// EmptyGrace is how long a key file must stay without keys before an
// unforced reload revokes every key: a file caught between its truncation
// and its new content (os.WriteFile, an editor) is empty too, and a
// writer descheduled on a loaded machine can leave it so for more than
// one reload interval when the interval is short.
const EmptyGrace = time.Second

// keySet is one loaded version of the file; immutable.
type keySet struct {
	digests [][sha256.Size]byte
	keys    []*Key
}

// Load reads the key file at path. Errors: the file's, and Parse's
// (wrapping ErrPlaintext or ErrInvalid, naming the line).
func Load(path string) (*Keys, error) {
	k := &Keys{file: watched{path: path}, now: time.Now}
	if _, err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// Path returns the key file's path.
func (k *Keys) Path() string { return k.file.path }

// Len returns the number of keys loaded.
func (k *Keys) Len() int { return len(k.cur.Load().keys) }

// Names returns the distinct names of the keys loaded (their Labels),
// sorted; the caller owns the slice.
func (k *Keys) Names() []string {
	var out []string
	for _, key := range k.cur.Load().keys {
		out = append(out, key.Name)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Authenticate returns the key whose hash is the SHA-256 of presented, or
// nil when none is. It hashes presented once and compares the digest with
// every key's in constant time, whatever the position of a match.
func (k *Keys) Authenticate(presented string) *Key {
	d := Hash(presented)
	set := k.cur.Load()
	idx, found := 0, 0
	for i := range set.digests {
		eq := subtle.ConstantTimeCompare(d[:], set.digests[i][:])
		idx = subtle.ConstantTimeSelect(eq, i, idx)
		found |= eq
	}
	if found == 0 {
		return nil
	}
	return set.keys[idx]
}

// Reload rereads the key file whether or not it changed. On success the
// new keys replace the old at once (a key kept keeps its buckets) and it
// returns true; on failure the old keys stay and it returns the error
// (see Load).
func (k *Keys) Reload() (bool, error) { return k.reload(true) }

// ReloadIfChanged rereads the key file only when it changed since the
// last read (see the package doc); it reports whether the keys were
// replaced. Errors as Reload's; a failed content is not tried again
// until it changes.
func (k *Keys) ReloadIfChanged() (bool, error) { return k.reload(false) }

func (k *Keys) reload(force bool) (bool, error) {
	return k.file.reload(force, func(data []byte) error {
		es, err := Parse(data)
		if err != nil {
			k.emptySince = time.Time{}
			return fmt.Errorf("apikey: %s: %w", k.file.path, err)
		}
		if len(es) == 0 && !force && k.cur.Load() != nil && len(k.cur.Load().keys) > 0 {
			// A file without keys revokes every key, but only once a
			// look EmptyGrace or more after the first still finds it
			// so.
			now := k.now()
			if k.emptySince.IsZero() {
				k.emptySince = now
			}
			if now.Sub(k.emptySince) < EmptyGrace {
				return errLookAgain
			}
		}
		k.emptySince = time.Time{}
		old := k.cur.Load()
		lims := make(map[[sha256.Size]byte]*limiter)
		if old != nil {
			for i, d := range old.digests {
				lims[d] = old.keys[i].lim
			}
		}
		set := &keySet{}
		for _, e := range es {
			lim := lims[e.Digest]
			if lim == nil {
				lim = &limiter{}
			}
			lim.configure(e.RPM, e.TPM)
			set.digests = append(set.digests, e.Digest)
			set.keys = append(set.keys, &Key{Name: e.Label(), Prefix: DigestPrefix(e.Digest), digest: e.Digest, tenant: e.Tenant, lim: lim})
		}
		k.cur.Store(set)
		return nil
	})
}

// watched is a file reloaded when it changes. reload calls are
// serialized.
type watched struct {
	path string
	mu   sync.Mutex
	// The modification time, size and SHA-256 of the content last read
	// (loaded or refused), and whether one was read.
	mod  time.Time
	size int64
	sum  [sha256.Size]byte
	read bool
	// gone: the last stat failed (reported once until a forced reload).
	gone bool
}

// errLookAgain is returned by a load to have the next unforced reload
// read the same content again instead of skipping it as unchanged.
var errLookAgain = errors.New("apikey: look again")

// reload reads the file, unless !force and it did not change, and hands
// its content to load, which must keep the old state on error
// (errLookAgain: no error, read it again next time). It
// reports whether load ran and succeeded. Unless forced, a file that
// cannot be read is reported once, not on every call.
func (w *watched) reload(force bool, load func([]byte) error) (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fi, err := os.Stat(w.path)
	if err != nil {
		if w.gone && !force {
			return false, nil
		}
		w.gone = true
		return false, fmt.Errorf("apikey: %w", err)
	}
	w.gone = false
	if !force && w.read && fi.ModTime().Equal(w.mod) && fi.Size() == w.size {
		return false, nil
	}
	data, err := os.ReadFile(w.path)
	if err != nil {
		return false, fmt.Errorf("apikey: %w", err)
	}
	sum := sha256.Sum256(data)
	unchanged := w.read && bytes.Equal(sum[:], w.sum[:])
	pmod, psize, psum, pread := w.mod, w.size, w.sum, w.read
	w.mod, w.size, w.sum, w.read = fi.ModTime(), fi.Size(), sum, true
	if unchanged && !force {
		return false, nil
	}
	if err := load(data); errors.Is(err, errLookAgain) {
		w.mod, w.size, w.sum, w.read = pmod, psize, psum, pread
		return false, nil
	} else if err != nil {
		return false, err
	}
	return true, nil
}
