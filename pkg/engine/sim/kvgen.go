package sim

import (
	"encoding/binary"
	"math"
	"math/bits"
	"math/rand/v2"
	"sync"
)

// KV values are synthesised, never stored. Each token's row of K (and of V)
// in a layer is a pure function of the token's content key (a hash of the
// sequence's tokens up to it, see tokens.go) and the layer, built from a
// pattern computed once per engine:
//
//   - The pattern holds patternRows rows of Gaussian values with
//     per-channel scales (a channel is one (KV head, dim) pair): K has
//     log-normal channel scales and a few outlier channels eight times
//     larger, as RoPE'd keys do; V is milder. Values are rounded to bf16.
//   - A token's row is assembled from 8-value segments, each taken from a
//     pseudo-randomly chosen pattern row at the same channels (so channel
//     statistics hold) with its sign and mantissa bits XORed with a
//     keystream. The exponent distribution is exactly the pattern's, the
//     sign and mantissa bits are uniform, and nothing repeats for longer
//     than a segment, so a lossless codec finds what it would find in real
//     bf16 KV (≈1.5× at best, from the exponent's entropy) and no more.
//   - The first 8 values of every K row carry the token's 64-bit content
//     key in their sign and mantissa bits (exponents untouched). Import
//     reads it back, so an engine that receives KV knows the content of the
//     sequence without holding its bytes, and later exports regenerate the
//     same bytes.
//
// Cost: one 64-bit random draw per 4 values and a table load, about the
// cost of a memory copy.

const (
	patternRows = 64 // rows per pattern; a segment picks one (6 bits)
	segValues   = 8  // bf16 values per segment: two 64-bit words
	keyValues   = 8  // leading K values of a row that carry the content key
	// signMantissa selects the sign and mantissa bits of four
	// little-endian bf16 values in a 64-bit word; exponents are bits 7-14
	// of each 16-bit lane.
	signMantissa = 0x807F_807F_807F_807F
)

// kvgen synthesises the KV of one engine. It is immutable after
// newKVGen and safe for concurrent use.
type kvgen struct {
	layers   int
	rowElems int // values per token in one K (or V) row, a multiple of segValues
	// k and v hold the patterns segment-major: for segment s (values
	// 8s..8s+7 of a row), the patternRows candidate rows' two words each,
	// 2·patternRows words, so one masked index picks a row's segment.
	k, v   []uint64
	layerK []uint64 // per-layer salts
	layerV []uint64
}

// genKey identifies a kvgen: engines with equal keys share one.
type genKey struct {
	layers, rowElems int
	seed             uint64
}

var (
	gensMu sync.Mutex
	gens   = map[genKey]*kvgen{} // few entries: one per distinct model shape, payload scale and seed
)

// sharedKVGen returns the kvgen for (layers, rowElems, seed), building it
// once per process: many engines of one configuration (a simulated
// cluster in one process, tests) share the pattern.
func sharedKVGen(layers, rowElems int, seed uint64) *kvgen {
	k := genKey{layers, rowElems, seed}
	gensMu.Lock()
	defer gensMu.Unlock()
	g := gens[k]
	if g == nil {
		g = newKVGen(layers, rowElems, seed)
		gens[k] = g
	}
	return g
}

// newKVGen builds the pattern for rows of rowElems values (a positive
// multiple of segValues) from seed.
func newKVGen(layers, rowElems int, seed uint64) *kvgen {
	g := &kvgen{layers: layers, rowElems: rowElems}
	rng := rand.New(rand.NewPCG(seed, 0x6b76_6765_6e00_0001))
	scalesK := make([]float64, rowElems)
	scalesV := make([]float64, rowElems)
	for c := range rowElems {
		scalesK[c] = math.Exp(0.6 * rng.NormFloat64())
		if rng.IntN(32) == 0 {
			scalesK[c] *= 8 // outlier channel
		}
		scalesV[c] = 0.5 * math.Exp(0.3*rng.NormFloat64())
	}
	g.k = fillPattern(rng, scalesK)
	g.v = fillPattern(rng, scalesV)
	g.layerK = make([]uint64, layers)
	g.layerV = make([]uint64, layers)
	for l := range layers {
		g.layerK[l] = rng.Uint64()
		g.layerV[l] = rng.Uint64()
	}
	return g
}

func fillPattern(rng *rand.Rand, scales []float64) []uint64 {
	segs := len(scales) / segValues
	words := make([]uint64, segs*2*patternRows)
	for r := range patternRows {
		for s := range segs {
			for half := range 2 {
				var w uint64
				for j := range 4 {
					c := s*segValues + 4*half + j
					x := rng.NormFloat64() * scales[c]
					if math.Abs(x) < 1e-6 { // keep clear of zero and subnormals
						x = math.Copysign(1e-6, x)
					}
					w |= uint64(bf16(float32(x))) << (16 * j)
				}
				words[s*2*patternRows+2*r+half] = w
			}
		}
	}
	return words
}

// bf16 rounds f to bfloat16 (round to nearest even; f is finite).
func bf16(f float32) uint16 {
	b := math.Float32bits(f)
	b += 0x7FFF + (b>>16)&1
	return uint16(b >> 16)
}

// tokenBytes is the size of one token in one layer: a K row and a V row.
func (g *kvgen) tokenBytes() int { return 2 * 2 * g.rowElems }

// fill writes the KV of tokens with the given content keys in layer into
// dst, which must hold len(keys)·tokenBytes() bytes: K rows of all tokens,
// then V rows (the canonical layout, with rowElems values per row).
func (g *kvgen) fill(dst []byte, keys []uint64, layer int) {
	rowBytes := 2 * g.rowElems
	vOff := len(keys) * rowBytes
	for i, key := range keys {
		kRow := dst[i*rowBytes : (i+1)*rowBytes]
		g.row(kRow, g.k, key^g.layerK[layer])
		embedKey(kRow, key)
		g.row(dst[vOff+i*rowBytes:vOff+(i+1)*rowBytes], g.v, key^g.layerV[layer])
	}
}

// row writes one row of rowElems values from pattern, driven by seed: per
// segment one random word picks the pattern row (bits 7-12) and gives the
// sign and mantissa masks of both words (the word and its rotation by 8,
// whose masked bits do not overlap).
func (g *kvgen) row(dst []byte, pattern []uint64, seed uint64) {
	s := wyrand{seed}
	for seg := range g.rowElems / segValues {
		r := s.next()
		cand := (*[2 * patternRows]uint64)(pattern[seg*2*patternRows:])
		i := int(r>>6) & (2*patternRows - 2)
		d := dst[16*seg : 16*seg+16]
		binary.LittleEndian.PutUint64(d[:8], cand[i]^(r&signMantissa))
		binary.LittleEndian.PutUint64(d[8:], cand[i+1]^(bits.RotateLeft64(r, 8)&signMantissa))
	}
}

// embedKey stores key in the sign and mantissa bits of the first keyValues
// values of a K row: byte j of the key in value j (sign ← bit 7, mantissa ←
// bits 0-6).
func embedKey(row []byte, key uint64) {
	for j := range keyValues {
		b := uint16(key >> (8 * j) & 0xFF)
		v := binary.LittleEndian.Uint16(row[2*j:])
		v = v&0x7F80 | (b&0x80)<<8 | b&0x7F
		binary.LittleEndian.PutUint16(row[2*j:], v)
	}
}

// extractKey reads the content key embedKey stored in a K row.
func extractKey(row []byte) uint64 {
	var key uint64
	for j := range keyValues {
		v := binary.LittleEndian.Uint16(row[2*j:])
		b := uint64(v>>8&0x80 | v&0x7F)
		key |= b << (8 * j)
	}
	return key
}

// wyrand is Wang Yi's wyrand generator: fast, 64-bit output, good enough
// statistics for synthetic data (not for cryptography).
type wyrand struct{ s uint64 }

func (w *wyrand) next() uint64 {
	w.s += 0xa0761d6478bd642f
	hi, lo := bits.Mul64(w.s, w.s^0xe7037ed1a0b428db)
	return hi ^ lo
}
