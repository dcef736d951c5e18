package kv

import (
	"encoding/binary"

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
