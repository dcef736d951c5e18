package config

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/pdserve/pdserve/pkg/router"
)

// Routing tunes the router (package router): its decode and prefill
// profiles' scorer weights, the prefill queues' bound and the rule for
// conditional disaggregation (router.Decider).
type Routing struct {
	// LocalPrefillBelowTokens: a prompt whose uncached tokens (prompt
	// minus the chosen decode worker's prefix-cache hit) are fewer than
	// this prefills on the decode worker itself (conditional
	// disaggregation); 0 = always remote.
	LocalPrefillBelowTokens int `yaml:"local_prefill_below_tokens"`
	// MaxQueuedPrefillTokens: a prefill worker with this many queued prompt
	// tokens takes no more requests; 0 = unbounded.
	MaxQueuedPrefillTokens int `yaml:"max_queued_prefill_tokens"`
	// PrefillQueueLocalTokens and BusyLocalPrefillBelowTokens: when every
	// prefill worker has at least PrefillQueueLocalTokens queued tokens, a
	// prompt whose uncached tokens are fewer than
	// BusyLocalPrefillBelowTokens prefills on its decode worker instead of
	// queueing. Both 0 (off) or both > 0, BusyLocalPrefillBelowTokens over
	// LocalPrefillBelowTokens.
	PrefillQueueLocalTokens     int `yaml:"prefill_queue_local_tokens"`
	BusyLocalPrefillBelowTokens int `yaml:"busy_local_prefill_below_tokens"`
	// Weights of the scorers of each profile; unset weights take the
	// defaults (DefaultDecodeWeights, DefaultPrefillWeights: prefix-aware).
	// Least-loaded routing sets both prefix weights to 0
	// (LeastLoadedYAML); round-robin is Picker.
	Weights RoutingWeights `yaml:"weights"`
	// Picker chooses a worker in both profiles: PickerMaxScore ("" too,
	// the default: the highest weighted score) or PickerRoundRobin (in
	// turn by worker id, ignoring every score: a baseline to measure
	// scoring against). With roundrobin no weight may be set, since none
	// would change anything.
	Picker string `yaml:"picker"`
	// RecentPromptMs is how long, in milliseconds, an ended request's
	// prompt counts as held by its decode and prefill workers before their
	// KV events or digests report it (router.Config.RecentTTL), so that
	// an agent's next turn finds the workers that hold its conversation.
	// nil: router.DefaultRecentTTL; 0: off.
	RecentPromptMs *int `yaml:"recent_prompt_ms"`
}

// RecentTTL is RecentPromptMs as the router takes it.
func (r Routing) RecentTTL() time.Duration {
	if r.RecentPromptMs == nil {
		return router.DefaultRecentTTL
	}
	return time.Duration(*r.RecentPromptMs) * time.Millisecond
}

// Pickers, the values of Routing.Picker: package router's.
const (
	PickerMaxScore   = router.PickerMaxScore
	PickerRoundRobin = router.PickerRoundRobin
)

// RoutingWeights are the scorer weights of the router's two profiles.
type RoutingWeights struct {
	Decode  DecodeWeights  `yaml:"decode"`
	Prefill PrefillWeights `yaml:"prefill"`
}

// DecodeWeights weigh the scorers that choose a decode (or colocated)
// worker; nil = default. Each is ≥ 0; a candidate's total is Σ weight ×
// score with scores in [0, 1].
type DecodeWeights struct {
	Prefix *float64 `yaml:"prefix"` // share of the prompt's blocks cached
	Queue  *float64 `yaml:"queue"`  // local prefill tokens queued
	KV     *float64 `yaml:"kv"`     // share of KV blocks free
	Batch  *float64 `yaml:"batch"`  // running batch
}

// PrefillWeights weigh the scorers that choose a prefill worker; nil =
// default. Prefill workers report no KV, so there is no kv weight.
type PrefillWeights struct {
	Prefix *float64 `yaml:"prefix"` // share of the prompt's blocks cached
	Queue  *float64 `yaml:"queue"`  // queued prefill tokens
	Batch  *float64 `yaml:"batch"`  // last prefill batch
}

// ScorerWeights are resolved weights, as package router takes them.
type ScorerWeights struct {
	Prefix, Queue, KV, Batch float64
}

// Default scorer weights, package router's, prefix-aware: decode workers
// by their cached prefix and free KV, the running batch breaking near
// ties; prefill workers by their cached prefix and queued tokens.
var (
	DefaultDecodeWeights  = ScorerWeights(router.DefaultDecodeWeights)
	DefaultPrefillWeights = ScorerWeights(router.DefaultPrefillWeights)
)

// LeastLoadedYAML is the routing section that chooses workers by load
// alone, prefix caches ignored (the defaults before prefix-aware routing:
// router.LeastLoadedDecodeWeights and LeastLoadedPrefillWeights).
const LeastLoadedYAML = "routing: {weights: {decode: {prefix: 0}, prefill: {prefix: 0}}}"

// or returns the first of ps that is set, else def.
func or(def float64, ps ...*float64) float64 {
	for _, p := range ps {
		if p != nil {
			return *p
		}
	}
	return def
}

// DecodeWeights returns the decode profile's weights, defaults filled in.
func (r Routing) DecodeWeights() ScorerWeights {
	d, w := DefaultDecodeWeights, r.Weights.Decode
	return ScorerWeights{Prefix: or(d.Prefix, w.Prefix), Queue: or(d.Queue, w.Queue), KV: or(d.KV, w.KV), Batch: or(d.Batch, w.Batch)}
}

// PrefillWeights returns the prefill profile's weights, defaults filled
// in.
func (r Routing) PrefillWeights() ScorerWeights {
	d, w := DefaultPrefillWeights, r.Weights.Prefill
	return ScorerWeights{Prefix: or(d.Prefix, w.Prefix), Queue: or(d.Queue, w.Queue), Batch: or(d.Batch, w.Batch)}
}

// PrefixAware reports whether any setting reads prefix caches, so that
// requests must carry their prompt's block hashes: a prefix weight
// (unless the picker ignores weights), or, with a prefill pool (not
// colocated), a threshold on uncached tokens.
func (r Routing) PrefixAware(colocated bool) bool {
	weights := r.Picker != PickerRoundRobin &&
		(r.DecodeWeights().Prefix > 0 || !colocated && r.PrefillWeights().Prefix > 0)
	return weights || !colocated && (r.LocalPrefillBelowTokens > 0 || r.BusyLocalPrefillBelowTokens > 0)
}

// weightsSet reports whether the policy sets any scorer weight.
func (r Routing) weightsSet() bool {
	d, p := r.Weights.Decode, r.Weights.Prefill
	return d.Prefix != nil || d.Queue != nil || d.KV != nil || d.Batch != nil ||
		p.Prefix != nil || p.Queue != nil || p.Batch != nil
}

// removedKeys are the routing keys that used to exist, and what to set
// instead: a policy file that still has one is refused at load with that
// advice, rather than as an unknown field.
var removedKeys = map[string]string{
	// prefix_weight was an alias of weights.prefill.prefix (the same
	// scale since scores lie in [0, 1]).
	"prefix_weight": "weights.prefill.prefix, the same weight",
}

// checkRemoved returns an error wrapping ErrInvalid naming the first
// removed routing key (removedKeys) in the policy document data, with
// its line; nil when there is none or data does not parse (the decoder
// that follows reports that).
func checkRemoved(data []byte) error {
	var doc struct {
		Routing map[string]yaml.Node `yaml:"routing"`
	}
	if yaml.Unmarshal(data, &doc) != nil {
		return nil
	}
	for _, k := range slices.Sorted(maps.Keys(doc.Routing)) {
		if instead, ok := removedKeys[k]; ok {
			n := doc.Routing[k]
			return fmt.Errorf("%w: line %d: routing.%s was removed: set routing.%s", ErrInvalid, n.Line, k, instead)
		}
	}
	return nil
}

func (r Routing) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: routing: "+format, append([]any{ErrInvalid}, a...)...)
	}
	for _, v := range []struct {
		name string
		n    int
	}{
		{"local_prefill_below_tokens", r.LocalPrefillBelowTokens},
		{"max_queued_prefill_tokens", r.MaxQueuedPrefillTokens},
		{"prefill_queue_local_tokens", r.PrefillQueueLocalTokens},
		{"busy_local_prefill_below_tokens", r.BusyLocalPrefillBelowTokens},
		{"recent_prompt_ms", int(r.RecentTTL() / time.Millisecond)},
	} {
		if v.n < 0 {
			return bad("%s must be ≥ 0, got %d", v.name, v.n)
		}
	}
	w := r.Weights
	for _, v := range []struct {
		name string
		p    *float64
	}{
		{"weights.decode.prefix", w.Decode.Prefix}, {"weights.decode.queue", w.Decode.Queue},
		{"weights.decode.kv", w.Decode.KV}, {"weights.decode.batch", w.Decode.Batch},
		{"weights.prefill.prefix", w.Prefill.Prefix}, {"weights.prefill.queue", w.Prefill.Queue},
		{"weights.prefill.batch", w.Prefill.Batch},
	} {
		if v.p != nil && (!(*v.p >= 0) || math.IsInf(*v.p, 0)) {
			return bad("%s must be a finite number ≥ 0, got %v", v.name, *v.p)
		}
	}
	switch {
	case r.Picker != "" && r.Picker != PickerMaxScore && r.Picker != PickerRoundRobin:
		return bad("picker must be %s or %s, got %q", PickerMaxScore, PickerRoundRobin, r.Picker)
	case r.Picker == PickerRoundRobin && r.weightsSet():
		return bad("picker %s ignores the scores: unset the weights", PickerRoundRobin)
	case r.DecodeWeights() == ScorerWeights{}:
		return bad("weights.decode are all 0: set at least one > 0")
	case r.PrefillWeights() == ScorerWeights{}:
		return bad("weights.prefill are all 0: set at least one > 0")
	case (r.PrefillQueueLocalTokens > 0) != (r.BusyLocalPrefillBelowTokens > 0):
		return bad("prefill_queue_local_tokens (%d) and busy_local_prefill_below_tokens (%d) work together: set both or neither",
			r.PrefillQueueLocalTokens, r.BusyLocalPrefillBelowTokens)
	case r.BusyLocalPrefillBelowTokens > 0 && r.BusyLocalPrefillBelowTokens <= r.LocalPrefillBelowTokens:
		return bad("busy_local_prefill_below_tokens (%d) must be over local_prefill_below_tokens (%d), which already prefills those prompts locally",
			r.BusyLocalPrefillBelowTokens, r.LocalPrefillBelowTokens)
	}
	return nil
}
