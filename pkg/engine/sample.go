package engine

import (
	"math"
	"slices"
)

// SampleScratch holds the buffers Sample reuses between calls so that a
// sampling step does not allocate once they have grown to the vocabulary
// size. The zero value is ready to use. A SampleScratch must not be used by
// two goroutines at once.
type SampleScratch struct {
	prob  []float64 // unnormalised probabilities, one per logit
	idx   []int32   // token ids ordered by probability (top-p only)
	idx2  []int32   // the radix sort's other buffer of ids (top-p only)
	keys  []uint64  // the radix sort's keys, and its other buffer of them
	keys2 []uint64
	pen   []float32 // penalised or masked copy of the logits (active penalties or a constraint only)
}

// Sample chooses the next token from logits (one value per vocabulary id)
// according to s, and returns its id. pos is the position the sampled token
// will take in its sequence (0-based: the number of tokens before it); the
// random draw depends only on (s.Seed, pos), so a request sampled on any
// worker, in any batch, yields the same tokens from the same logits.
//
// Greedy (s.Temperature == 0, also used for a negative or NaN temperature)
// returns the argmax, the lowest id among equal maxima. Otherwise the logits
// are divided by the temperature and turned into probabilities with a
// softmax; with 0 < s.TopP < 1 only the smallest set of most probable tokens
// whose mass reaches TopP is kept (ties in probability ordered by id), and a
// token is drawn from what is kept with the uniform value Uniform(s.Seed,
// pos). A TopP of 0, ≥ 1 or NaN keeps every token.
//
// When s.Penalties is Active, every rule above applies to penalised logits:
// a copy in scratch where logit[t] -= Frequency·count(t) + Presence for
// each counted token t with count(t) > 0 (ids outside logits are ignored).
// logits itself is never modified, so the caller can still compute raw
// logprobs from it; inactive penalties give the same token, bit for bit,
// as none.
//
// When s.Constraint is not nil, only tokens it allows can be chosen: it
// masks that copy after the penalties; when it allows none, every logit
// is -Inf and the argmax (id 0) is returned. A constraint that is a
// TokenChecker is asked first about the token the unmasked copy gives,
// and masks only when it refuses that token (llama.cpp's common sampler
// does the same; a mask over a large vocabulary costs tens of
// milliseconds, a check microseconds). Greedy then returns the same
// token, bit for bit, as masking first. A draw with the temperature
// (TopP inactive) that is refused is redrawn from the masked copy with
// a second value, Uniform(s.Seed^redrawSeed, pos): the token still has
// the masked distribution (an allowed t is kept with probability p(t)
// and redrawn with (1-p(A))·p(t)/p(A), p(t)/p(A) in all), but not the
// token masking first would draw. With TopP active the nucleus is that
// of the allowed tokens, so the copy is masked first.
//
// NaN logits are never chosen unless every logit is NaN; then Sample returns
// 0. An empty logits slice returns -1. scratch may be nil (Sample then
// allocates). Sample does not retain logits.
func Sample(logits []float32, s Sampling, pos int, scratch *SampleScratch) int32 {
	if len(logits) == 0 {
		return -1
	}
	if s.Penalties.Active() || s.Constraint != nil {
		if scratch == nil {
			scratch = new(SampleScratch)
		}
		pen := growBuf(&scratch.pen, len(logits))
		if s.Penalties.Active() {
			logits = penalise(pen, logits, s.Penalties)
		} else {
			logits = pen[:copy(pen, logits)]
		}
		if c := s.Constraint; c != nil {
			ck, lazy := c.(TokenChecker)
			if lazy && !(s.Temperature > 0 && s.TopP > 0 && s.TopP < 1) {
				if t := choose(logits, s, Uniform(s.Seed, pos), scratch); ck.Allows(t) {
					return t
				}
				c.Mask(logits)
				return choose(logits, s, Uniform(s.Seed^redrawSeed, pos), scratch)
			}
			c.Mask(logits)
		}
	}
	return choose(logits, s, Uniform(s.Seed, pos), scratch)
}

// redrawSeed changes the seed of a constrained draw's second value (see
// Sample).
const redrawSeed = 0x6772616d6d6172 // "grammar"

// TokenChecker is implemented by constraints that can tell cheaply
// whether one token is allowed next (see Sample).
type TokenChecker interface {
	Allows(token int32) bool
}

// choose is Sample's choice from logits (already penalised and masked)
// with the uniform value u.
func choose(logits []float32, s Sampling, u float64, scratch *SampleScratch) int32 {
	best := argmax(logits)
	if !(s.Temperature > 0) || math.IsNaN(float64(logits[best])) {
		return best
	}
	if scratch == nil {
		scratch = new(SampleScratch)
	}
	maxLogit := float64(logits[best])
	invT := 1 / float64(s.Temperature)
	prob := growBuf(&scratch.prob, len(logits))
	total := 0.0
	for i, l := range logits {
		p := 0.0
		if !math.IsNaN(float64(l)) {
			p = math.Exp((float64(l) - maxLogit) * invT)
			if p != p { // -Inf logit with an infinite temperature
				p = 0
			}
		}
		prob[i] = p
		total += p
	}
	topP := float64(s.TopP)
	if !(topP > 0 && topP < 1) {
		return drawInOrder(prob, nil, u*total, best)
	}
	return drawTopP(prob, topP*total, u, best, scratch)
}

// drawTopP draws, with the uniform value u, from the smallest prefix of the
// ids in orderProb's order (probability descending, ties by id) whose mass
// reaches want. The result is the one a comparison sort of the vocabulary
// would give, bit for bit (the prefix, and the order of its additions, are
// the same), at a fraction of its cost: the 64 most probable ids are
// selected with a heap in one pass over prob, which is enough for a peaked
// distribution; when their mass falls short of want, a radix sort orders
// the whole vocabulary (about 2 ms for Qwen2's 151,936 ids, where a
// comparison sort takes about 45).
func drawTopP(prob []float64, want, u float64, best int32, scratch *SampleScratch) int32 {
	ids := topProb(prob, min(64, len(prob)), growBuf(&scratch.idx, len(prob)))
	for {
		kept, mass := 0, 0.0
		for kept < len(ids) {
			mass += prob[ids[kept]]
			kept++
			if mass >= want {
				return drawInOrder(prob, ids[:kept], u*mass, best)
			}
		}
		if len(ids) == len(prob) {
			return drawInOrder(prob, ids, u*mass, best)
		}
		ids = sortByProb(prob, scratch)
	}
}

// sortByProb returns every id of prob in orderProb's order: a stable LSD
// radix sort, a byte per pass, on the complemented bits of each
// probability (for the non-negative floats Sample makes, the bits order as
// the values do, so their complement orders them descending) over ids
// that start in ascending order, so that equal probabilities stay ordered
// by id. Passes in which every key has the same byte are skipped.
func sortByProb(prob []float64, scratch *SampleScratch) []int32 {
	n := len(prob)
	keys, keys2 := growBuf(&scratch.keys, n), growBuf(&scratch.keys2, n)
	ids, ids2 := growBuf(&scratch.idx, n), growBuf(&scratch.idx2, n)
	for i, p := range prob {
		keys[i], ids[i] = ^math.Float64bits(p), int32(i)
	}
	var count [256]int
	for shift := 0; shift < 64; shift += 8 {
		count = [256]int{}
		for _, k := range keys {
			count[byte(k>>shift)]++
		}
		if count[byte(keys[0]>>shift)] == n {
			continue
		}
		at := 0
		for b, c := range count {
			count[b] = at
			at += c
		}
		for i, k := range keys {
			d := count[byte(k>>shift)]
			count[byte(k>>shift)]++
			keys2[d], ids2[d] = k, ids[i]
		}
		keys, keys2 = keys2, keys
		ids, ids2 = ids2, ids
	}
	return ids
}

// orderProb orders token ids by probability, descending, ties by id: a
// total order, so any selection of its first k ids is the same.
func orderProb(prob []float64, a, b int32) int {
	switch pa, pb := prob[a], prob[b]; {
	case pa > pb:
		return -1
	case pa < pb:
		return 1
	}
	return int(a - b)
}

// topProb returns the k ids first in orderProb's order, sorted, in heap
// (of capacity k): a binary heap whose root is the worst id kept, replaced
// whenever a later id comes before it.
func topProb(prob []float64, k int, heap []int32) []int32 {
	heap = heap[:0]
	// worse reports whether heap[i] comes after heap[j] (the root is the
	// last in order of those kept).
	worse := func(i, j int) bool { return orderProb(prob, heap[i], heap[j]) > 0 }
	down := func(i int) {
		for {
			c := 2*i + 1
			if c >= len(heap) {
				return
			}
			if c+1 < len(heap) && worse(c+1, c) {
				c++
			}
			if !worse(c, i) {
				return
			}
			heap[i], heap[c] = heap[c], heap[i]
			i = c
		}
	}
	for id := range int32(len(prob)) {
		if len(heap) < k {
			heap = append(heap, id)
			for i := len(heap) - 1; i > 0; {
				parent := (i - 1) / 2
				if !worse(i, parent) {
					break
				}
				heap[i], heap[parent] = heap[parent], heap[i]
				i = parent
			}
			continue
		}
		// id is after every id before it, so it beats the root only on
		// probability: a tie in probability leaves the root in place.
		if prob[id] > prob[heap[0]] {
			heap[0] = id
			down(0)
		}
	}
	slices.SortFunc(heap, func(a, b int32) int { return orderProb(prob, a, b) })
	return heap
}

// penalise copies logits into dst (of the same length), applies p's
// penalties to the copy and returns it.
func penalise(dst, logits []float32, p *Penalties) []float32 {
	copy(dst, logits)
	for t, c := range p.Counts {
		if c > 0 && t >= 0 && int(t) < len(dst) {
			dst[t] -= p.Frequency*float32(c) + p.Presence
		}
	}
	return dst
}

// drawInOrder walks ids (all of prob in id order when ids is nil) and
// returns the first whose cumulative probability exceeds target. Rounding
// can leave target at or above the final sum; the last id with a non-zero
// probability is returned then, or fallback when there is none.
func drawInOrder(prob []float64, ids []int32, target float64, fallback int32) int32 {
	cum, last := 0.0, fallback
	if ids == nil {
		for i, p := range prob {
			if p == 0 {
				continue
			}
			cum += p
			last = int32(i)
			if cum > target {
				return last
			}
		}
		return last
	}
	for _, id := range ids {
		p := prob[id]
		if p == 0 {
			continue
		}
		cum += p
		last = id
		if cum > target {
			return last
		}
	}
	return last
}

// argmax returns the id of the largest non-NaN logit, the lowest such id on
// ties, or 0 when every logit is NaN.
func argmax(logits []float32) int32 {
	best := int32(-1)
	var bestV float32
	for i, l := range logits {
		if l != l { // NaN
			continue
		}
		if best < 0 || l > bestV {
			best, bestV = int32(i), l
		}
	}
	if best < 0 {
		return 0
	}
	return best
}

// Uniform returns the random value in [0, 1) that sampling uses for the
// token at position pos of a request seeded with seed. It is a pure
// function of (seed, pos): splitmix64(splitmix64(seed) XOR pos), top 53
// bits. Engines that choose tokens without logits use it too, so that every
// engine draws the same values.
func Uniform(seed uint64, pos int) float64 {
	h := splitmix64(splitmix64(seed) ^ uint64(pos))
	return float64(h>>11) * 0x1p-53
}

// splitmix64 is the finaliser of Steele, Lea and Flood's SplitMix64
// generator applied to x + golden gamma: a bijective 64-bit mix.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// growBuf returns *buf resliced to n elements, reallocated when its
// capacity is short: the scratch buffers a Sampler reuses.
func growBuf[T any](buf *[]T, n int) []T {
	if cap(*buf) < n {
		*buf = make([]T, n)
	}
	*buf = (*buf)[:n]
	return *buf
}
