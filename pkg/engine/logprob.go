package engine

import (
	"math"
	"slices"
)

// Logprob returns the log-probability of token under logits (the natural
// log of their softmax; NaN logits count as -Inf) with the top most
// probable alternatives, most probable first, ties by lower id (NaN logits
// last). top is clamped to [0, MaxTopLogprobs] and to the vocabulary.
// Logprob does not retain logits. A token outside logits gets -Inf, and so
// does every token when no logit is above -Inf; when some logits are
// +Inf, they share the probability equally.
func Logprob(logits []float32, token int32, top int) TokenLogprob {
	out := TokenLogprob{Token: token, Logprob: float32(math.Inf(-1))}
	if len(logits) == 0 {
		return out
	}
	maxL := math.Inf(-1)
	for _, l := range logits {
		if v := float64(l); v > maxL {
			maxL = v
		}
	}
	if math.IsInf(maxL, -1) {
		return out // no finite logit: every token is impossible
	}
	var lp func(id int32) float32
	if math.IsInf(maxL, 1) {
		// +Inf logits share all the mass equally; the rest get none.
		k := 0
		for _, l := range logits {
			if math.IsInf(float64(l), 1) {
				k++
			}
		}
		share := float32(-math.Log(float64(k)))
		lp = func(id int32) float32 {
			if math.IsInf(float64(logits[id]), 1) {
				return share
			}
			return float32(math.Inf(-1))
		}
	} else {
		sum := 0.0
		for _, l := range logits {
			if v := float64(l); v == v {
				sum += math.Exp(v - maxL)
			}
		}
		logZ := maxL + math.Log(sum)
		lp = func(id int32) float32 {
			v := float64(logits[id])
			if v != v {
				return float32(math.Inf(-1))
			}
			return float32(v - logZ)
		}
	}
	if token >= 0 && int(token) < len(logits) {
		out.Logprob = lp(token)
	}
	top = min(max(top, 0), MaxTopLogprobs, len(logits))
	if top == 0 {
		return out
	}
	// Keep the best top ids by insertion: top ≤ 20, so a linear pass with
	// a small sorted buffer beats sorting the vocabulary.
	best := make([]int32, 0, top+1)
	better := func(a, b int32) bool { // a ranks before b
		la, lb := logits[a], logits[b]
		switch {
		case la != la && lb != lb:
			return a < b
		case la != la:
			return false
		case lb != lb:
			return true
		case la != lb:
			return la > lb
		}
		return a < b
	}
	for i := range logits {
		id := int32(i)
		if len(best) == top && !better(id, best[top-1]) {
			continue
		}
		at, _ := slices.BinarySearchFunc(best, id, func(x, y int32) int {
			if better(x, y) {
				return -1
			}
			return 1
		})
		best = slices.Insert(best, at, id)
		if len(best) > top {
			best = best[:top]
		}
	}
	out.Top = make([]TokenProb, len(best))
	for i, id := range best {
		out.Top[i] = TokenProb{Token: id, Logprob: lp(id)}
	}
	return out
}

// StandInLogprob returns a deterministic stand-in for engines that compute
// no logits (the performance-model engine): it is not a model's
// probability. The chosen token gets log(1/2); top alternatives are the
// token itself then ids drawn from Uniform(token, pos) over vocab, with
// log-probabilities halving down the list. A pure function of its
// arguments.
func StandInLogprob(token int32, pos, top, vocab int) TokenLogprob {
	out := TokenLogprob{Token: token, Logprob: float32(-math.Ln2)}
	top = min(max(top, 0), MaxTopLogprobs, vocab)
	seen := map[int32]bool{}
	for i := 0; len(out.Top) < top; i++ {
		id := token
		if i > 0 {
			id = int32(Uniform(uint64(token)<<32|uint64(pos), i) * float64(vocab))
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		out.Top = append(out.Top, TokenProb{Token: id, Logprob: float32(-math.Ln2 * float64(len(out.Top)+1))})
	}
	return out
}
