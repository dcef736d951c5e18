package sim

import (
	"math"

	"github.com/pdserve/pdserve/pkg/engine"
)

// Token choice. Every token a sequence holds has a 64-bit content key,
// chained over the sequence's token ids:
//
//	key(-1) = rootKey,  key(i) = mix(key(i-1) ⊕ (id(i)+1)·γ)
//
// so a key stands for the whole prefix up to its token, like the KV of a
// real model. The sampled token at position pos (the number of tokens
// before it) depends only on the last key, pos and the request's
// sampling parameters — never on the SeqID, the batch or the worker — and
// the last key travels inside exported KV (kvgen.go), so a sequence
// prefilled on one engine and imported into another continues with the
// same tokens.

const (
	rootKey = 0x7064_7365_7276_6531 // key before the first token
	gamma   = 0x9e37_79b9_7f4a_7c15 // golden-ratio increment (splitmix64)
)

// mix is the splitmix64 finaliser: a bijective 64-bit hash.
func mix(x uint64) uint64 {
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// nextKey chains one token onto the key of the prefix before it.
func nextKey(prev uint64, id int32) uint64 { return mix(prev ^ uint64(uint32(id)+1)*gamma) }

// appendKeys appends the keys of ids, chained from prev, to dst.
func appendKeys(dst []uint64, prev uint64, ids []int32) []uint64 {
	for _, id := range ids {
		prev = nextKey(prev, id)
		dst = append(dst, prev)
	}
	return dst
}

// text is the distribution generated tokens are drawn from: printable
// ASCII with roughly English letter frequencies, spaces and some
// punctuation, so decoded output reads as word-like text. 128 entries.
var text = func() [128]byte {
	weights := []struct {
		c byte
		n int
	}{
		{'e', 12}, {'t', 9}, {'a', 8}, {'o', 8}, {'i', 7}, {'n', 7}, {'s', 6}, {'h', 6}, {'r', 6},
		{'d', 4}, {'l', 4}, {'c', 3}, {'u', 3}, {'m', 2}, {'w', 2}, {'f', 2}, {'g', 2}, {'y', 2},
		{'p', 2}, {'b', 1}, {'v', 1}, {'k', 1}, {'T', 1}, {'I', 1}, {',', 1}, {'.', 1},
	}
	var t [128]byte
	i := 0
	for _, w := range weights {
		for range w.n {
			t[i] = w.c
			i++
		}
	}
	for ; i < len(t); i++ {
		t[i] = ' '
	}
	return t
}()

// sampleToken returns the token that follows a prefix with last key key,
// at position pos, under s, from a vocabulary of vocab ids. Greedy
// sampling (Temperature ≤ 0) depends on (key, pos) only. With Temperature
// T > 0 the greedy token is kept with probability 1/(1+T) and otherwise
// replaced by a draw, both decided by engine.Uniform(s.Seed, pos), the
// value every engine draws at that position. TopP and Penalties are not
// modelled. Without a constraint the result is a printable byte id, never
// EOS: output lengths are set by the request's token budget. With
// s.Constraint (a grammar) it is that byte when the constraint allows it,
// else the allowed id (EOS included) first in an order drawn from the
// same hash (constrained).
func sampleToken(key uint64, pos int, s engine.Sampling, vocab int) int32 {
	h := mix(key ^ uint64(pos)*gamma)
	if s.Temperature > 0 {
		u := engine.Uniform(s.Seed, pos)
		if u >= 1/(1+float64(s.Temperature)) {
			h = mix(h ^ uint64(u*(1<<53)))
		}
	}
	tok := int32(text[h&127])
	if s.Constraint == nil {
		return tok
	}
	return constrained(h, tok, s.Constraint, vocab)
}

// constrained returns tok when c allows it, else the id c allows whose
// score, a hash of h and the id, is highest: a deterministic stand-in for
// the logits a model masks. When c allows nothing it returns tok (the
// worker's grammar state then refuses it).
func constrained(h uint64, tok int32, c engine.Constraint, vocab int) int32 {
	scores := make([]float32, vocab)
	for i := range scores {
		scores[i] = float32(mix(h^uint64(i+1)*gamma) >> 41) // < 2^23: exact, and below tok's
	}
	if int(tok) < vocab {
		scores[tok] = 1 << 23
	}
	c.Mask(scores)
	best := -1
	for i, v := range scores {
		if !math.IsInf(float64(v), -1) && (best < 0 || v > scores[best]) {
			best = i
		}
	}
	if best < 0 {
		return tok
	}
	return int32(best)
}
