package router

// Decider decides whether a prompt prefills on its decode worker or on a
// prefill worker (conditional disaggregation), from the prompt's uncached
// tokens and the prefill pool's load. It is pure and has no state.
//
// The rule, with u = PromptTokens − the chosen decode worker's prefix hit
// (tokens of the prompt's leading full blocks it holds: Worker.Prefix, else its PrefixDigest):
//
//  1. Short: u < LocalPrefillBelowTokens → local prefill (when
//     LocalPrefillBelowTokens > 0).
//  2. Busy: every eligible prefill worker (not draining, not excluded,
//     serving the model; at least one) has QueuedPrefillTokens ≥
//     PrefillQueueLocalTokens (its heartbeat's plus this router's later
//     assignments), and u < BusyLocalPrefillBelowTokens → local prefill
//     (when PrefillQueueLocalTokens > 0).
//  3. Otherwise the prompt prefills remotely.
//
// Colocated mode and Request.Local always prefill locally, and
// Request.DecodeOnly never prefills; the Decider is not asked then.
type Decider struct {
	// LocalPrefillBelowTokens: rule 1's threshold (tokens); 0 = off.
	LocalPrefillBelowTokens int
	// PrefillQueueLocalTokens: rule 2's queue threshold (tokens per
	// prefill worker); 0 = off.
	PrefillQueueLocalTokens int
	// BusyLocalPrefillBelowTokens: rule 2's threshold on u (tokens);
	// meaningful above LocalPrefillBelowTokens.
	BusyLocalPrefillBelowTokens int
}

// Short reports rule 1: a prompt of uncached tokens prefills locally
// whatever the prefill pool's load.
func (d Decider) Short(uncached int) bool {
	return d.LocalPrefillBelowTokens > 0 && uncached < d.LocalPrefillBelowTokens
}

// Busy reports rule 2: the prefill pool, whose eligible workers have the
// given queued prefill tokens, is too busy for a prompt of uncached
// tokens, which prefills locally instead. queued is read, not kept.
func (d Decider) Busy(uncached int, queued []int) bool {
	if d.PrefillQueueLocalTokens <= 0 || uncached >= d.BusyLocalPrefillBelowTokens || len(queued) == 0 {
		return false
	}
	for _, q := range queued {
		if q < d.PrefillQueueLocalTokens {
			return false
		}
	}
	return true
}
