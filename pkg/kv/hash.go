package kv

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"

	"github.com/cespare/xxhash/v2"
)

// Hash identifies a token prefix that ends on a block boundary: the chained
// hash of HashBlocks. Values are stable across processes and platforms.
type Hash uint64

// RootHash returns a chain root for namespace, e.g. a model name, so that
// equal token prefixes under different models or tokenizers hash apart. The
// empty namespace gives 0, the plain root.
func RootHash(namespace string) Hash {
	if namespace == "" {
		return 0
	}
	return Hash(xxhash.Sum64String(namespace))
}

// HashBlocks returns one hash per FULL block of tokens: hash(i) =
// xxhash64(le64(hash(i-1)) ‖ le32 of each token of block i), with hash(-1) =
// parent. A partial last block is ignored, so len(result) =
// len(tokens)/blockTokens; blockTokens ≤ 0 gives nil. To continue a chain
// over a later part of a sequence, pass the last hash of the earlier part as
// parent and start tokens on a block boundary.
func HashBlocks(parent Hash, tokens []int32, blockTokens int) []Hash {
	if blockTokens <= 0 {
		return nil
	}
	n := len(tokens) / blockTokens
	if n == 0 {
		return nil
	}
	hashes := make([]Hash, n)
	buf := make([]byte, 8+4*blockTokens)
	prev := parent
	for i := range hashes {
		binary.LittleEndian.PutUint64(buf, uint64(prev))
		b := buf[8:]
		for j, t := range tokens[i*blockTokens : (i+1)*blockTokens] {
			binary.LittleEndian.PutUint32(b[4*j:], uint32(t))
		}
		prev = Hash(xxhash.Sum64(buf))
		hashes[i] = prev
	}
	return hashes
}

// MinHashKeyBytes is the shortest secret NewHashKey takes.
const MinHashKeyBytes = 32

// HashKey is a deployment's secret for block hashes. With a key, the chain
// is SHA-256 under a 64-byte secret prefix derived from it (Blocks), so that
// nobody without the key can compute a prompt's hashes from its text, and
// so cannot claim, probe or request a prefix by hash. The zero HashKey is
// no key: HashBlocks' public xxhash64 chain, which anyone can compute (a
// deployment running so is told at start). Every process of a deployment
// must use the same key: the coordinator's and the workers' hashes are
// compared (the heartbeat's hash_key_id, ID). Comparable; safe for
// concurrent use.
type HashKey struct {
	secret string
}

// NewHashKey returns the key of secret: at least MinHashKeyBytes bytes.
func NewHashKey(secret []byte) (HashKey, error) {
	if len(secret) < MinHashKeyBytes {
		return HashKey{}, fmt.Errorf("kv: a hash key needs at least %d bytes, got %d", MinHashKeyBytes, len(secret))
	}
	return HashKey{secret: string(secret)}, nil
}

// GenerateHashKey returns a new random key (crypto/rand): a standalone
// server's, whose processes share it in memory.
func GenerateHashKey() HashKey {
	b := make([]byte, MinHashKeyBytes)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return HashKey{secret: string(b)}
}

// LoadHashKey reads a key file (--kv-hash-key-file): its content, less
// surrounding white space, is the secret (e.g. 64 hex digits from
// `openssl rand -hex 32`). Errors name the file, never its content.
func LoadHashKey(path string) (HashKey, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return HashKey{}, fmt.Errorf("kv-hash-key-file: %w", err)
	}
	if fi.Size() > 4096 {
		return HashKey{}, fmt.Errorf("kv-hash-key-file %s: %d bytes, want a short secret", path, fi.Size())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return HashKey{}, fmt.Errorf("kv-hash-key-file: %w", err)
	}
	k, err := NewHashKey(bytes.TrimSpace(b))
	if err != nil {
		return HashKey{}, fmt.Errorf("kv-hash-key-file %s: %w", path, err)
	}
	return k, nil
}

// Keyed reports whether k is a key (not the zero HashKey).
func (k HashKey) Keyed() bool { return k.secret != "" }

// ID names the key without revealing it: 16 hex digits of an HMAC under
// it, for heartbeats and logs, so that processes can tell they hash
// alike; "" for no key.
func (k HashKey) ID() string {
	if !k.Keyed() {
		return ""
	}
	m := hmac.New(sha256.New, []byte(k.secret))
	m.Write([]byte("pdserve kv hash key id"))
	return hex.EncodeToString(m.Sum(nil)[:8])
}

// Root returns the chain root of namespace: a tenant's partition of the
// prefix caches (see the coordinator's cache partitions), so that equal
// prompts of different namespaces hash apart, as vLLM's cache_salt does.
// The empty namespace gives 0, the plain root. With a key the root is an
// HMAC under it, else RootHash(namespace).
func (k HashKey) Root(namespace string) Hash {
	if namespace == "" {
		return 0
	}
	if !k.Keyed() {
		return RootHash(namespace)
	}
	m := hmac.New(sha256.New, []byte(k.secret))
	m.Write([]byte("pdserve kv root\x00"))
	m.Write([]byte(namespace))
	return Hash(binary.LittleEndian.Uint64(m.Sum(nil)))
}

// prefix is the 64 bytes every keyed block hash starts with: an HMAC of
// the key, so that the secret itself is never hashed next to data.
func (k HashKey) prefix() []byte {
	m := hmac.New(sha256.New, []byte(k.secret))
	m.Write([]byte("pdserve kv block key"))
	p := m.Sum(nil)
	return append(p, make([]byte, 64-len(p))...)
}

// Blocks is HashBlocks under k: with a key, hash(i) = the first 8 bytes
// (little-endian) of SHA-256(p ‖ le64(hash(i-1)) ‖ le32 of each token of
// block i), where p is 64 bytes derived from the key by HMAC; without,
// HashBlocks itself. The caller owns the result.
func (k HashKey) Blocks(parent Hash, tokens []int32, blockTokens int) []Hash {
	if !k.Keyed() {
		return HashBlocks(parent, tokens, blockTokens)
	}
	if blockTokens <= 0 {
		return nil
	}
	n := len(tokens) / blockTokens
	if n == 0 {
		return nil
	}
	hashes := make([]Hash, n)
	// One 64-byte block of the key's MAC, then each block's bytes: the
	// message is of fixed length after a secret block, so no extension
	// applies, and one SHA-256 call a block is half of HMAC's work.
	d := sha256.New()
	d.Write(k.prefix())
	state, _ := d.(encoding.BinaryMarshaler).MarshalBinary() // sha256's digest marshals, never failing
	u := d.(encoding.BinaryUnmarshaler)
	buf := make([]byte, 8+4*blockTokens)
	sum := make([]byte, 0, sha256.Size)
	prev := parent
	for i := range hashes {
		binary.LittleEndian.PutUint64(buf, uint64(prev))
		b := buf[8:]
		for j, t := range tokens[i*blockTokens : (i+1)*blockTokens] {
			binary.LittleEndian.PutUint32(b[4*j:], uint32(t))
		}
		_ = u.UnmarshalBinary(state) // its own state: never fails
		d.Write(buf)
		sum = d.Sum(sum[:0])
		prev = Hash(binary.LittleEndian.Uint64(sum))
		hashes[i] = prev
	}
	return hashes
}
