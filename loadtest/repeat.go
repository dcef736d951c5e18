package main

import (
	"math/rand/v2"

	"github.com/pdserve/pdserve/pkg/workload"
)

// repeatRequests makes each request after the first, with probability
// fraction in [0, 1), an exact repeat of an earlier one chosen uniformly
// (the same prompt and max_tokens; its own arrival), drawn from seed, so
// that a response cache can serve it. A repeat carries the Index of the
// request it repeats (its body depends on it). It returns the number of
// repeats; the rest of reqs is unchanged.
func repeatRequests(reqs []workload.Request, fraction float64, seed uint64) int {
	if fraction <= 0 {
		return 0
	}
	rng := rand.New(rand.NewPCG(seed, 0x7265706561740000)) // "repeat"
	n := 0
	for i := 1; i < len(reqs); i++ {
		if rng.Float64() >= fraction {
			continue
		}
		src := reqs[rng.IntN(i)]
		src.Arrival = reqs[i].Arrival
		reqs[i] = src
		n++
	}
	return n
}
