package framework

import "time"

// Worker is a snapshot of one worker, as its latest heartbeat told it.
// Package router re-exports it as router.Worker.
type Worker struct {
	ID                  string
	Addr                string // gRPC address
	KVBlocksFree        int
	KVBlocksTotal       int
	QueuedPrefillTokens int
	RunningBatch        int
	// PrefixDigest holds the hashes of the prompt-prefix blocks the worker
	// has cached (chained block hashes, see pkg/kv.HashBlocks), as far as
	// its heartbeat lists them. Read only. Ignored when Prefix is set.
	PrefixDigest []uint64
	// Prefix, when not nil, knows every block the worker's prefix cache
	// holds (the coordinator's index of the worker's KV events): it
	// replaces PrefixDigest.
	Prefix PrefixMatcher
	// HostPrefix, when not nil, knows every block the host-memory tier of
	// the worker's prefix cache holds (the index of its host tier's KV
	// events): blocks the worker loads from host RAM instead of
	// computing them.
	HostPrefix PrefixMatcher
	// DiskPrefix, when not nil, knows every block the disk tier behind
	// the host tier holds (the index of its disk tier's KV events):
	// blocks the worker reads from disk instead of computing them.
	DiskPrefix PrefixMatcher
	// PeerPullCost is the time the worker takes to pull one block of a
	// cached prefix from another worker over the time it takes to compute
	// it, by its own link model and measured prefill throughput (its
	// heartbeat's peer_pull_cost); 0: it does not pull (pulls off, an
	// older worker, or no step measured yet).
	PeerPullCost float64
	Draining     bool
	// Model is the model the worker serves; empty serves any.
	Model string
	// MaxSeqLen is the worker's own longest sequence (prompt + output),
	// tokens; 0: it does not say.
	MaxSeqLen int
	// MaxBatch is the most sequences one step of the worker runs; 0: it
	// does not say.
	MaxBatch int
	// Time is when the snapshot was taken (the worker's clock).
	Time time.Time
}

// PrefixMatcher tells which prompt blocks a worker holds.
type PrefixMatcher interface {
	// Match returns how many of hashes (chained block hashes), from the
	// first, the worker holds: the match stops at the first miss. It is
	// safe for concurrent use and must not keep hashes.
	Match(hashes []uint64) int
}

// Request is what the router needs to know about a request. Package
// router re-exports it as router.Request.
type Request struct {
	ID           string
	PromptTokens int // > 0
	MaxTokens    int // ≥ 0
	// PrefixHashes are the chained hashes of the prompt's full blocks, in
	// order (pkg/kv.HashBlocks with the router's block size); nil disables
	// prefix matching for this request. Read only.
	PrefixHashes []uint64
	// DecodeOnly chooses a decode worker only (a recovery, where the KV
	// comes from the prefill worker that already holds it): Local and
	// Prefill of the Decision stay zero.
	DecodeOnly bool
	// Local prefills on the decode worker whatever the prompt's size (the
	// request needs the prompt's logits there: prompt logprobs).
	Local bool
	// Model, when not empty, limits the choice to workers serving it (or
	// any model).
	Model string
	// SeqTokens, when > 0, is the request's longest sequence (prompt +
	// max_tokens of one choice): only workers whose MaxSeqLen fits it (or
	// is unknown) may take it.
	SeqTokens int
	// Peers, when not nil, are the workers a prefilling worker may pull
	// the prompt's prefix from (every live worker that keeps prompts,
	// whatever its role); nil: the decode and prefill workers given to
	// Route. Read only.
	Peers []Worker
}

// Load is a worker's load as the router estimates it: its snapshot's
// values plus the router's own assignments made after the snapshot was
// taken. KVBlocksFree may be negative (assignments beyond the snapshot's
// free blocks).
type Load struct {
	KVBlocksFree        int
	RunningBatch        int
	QueuedPrefillTokens int // tokens
}

// Candidate is one worker as the plugins of a profile see it.
type Candidate struct {
	Worker Worker
	Load   Load
	// PrefixHitBlocks is the number of the request's leading blocks
	// (Request.PrefixHashes) the worker holds (Worker.Prefix, else found in
	// Worker.PrefixDigest); the match stops
	// at the first miss, as the hashes are chained. 0 when the request has
	// no hashes. 0 ≤ PrefixHitBlocks ≤ len(Request.PrefixHashes).
	PrefixHitBlocks int
	// HostHitBlocks is the number of the request's leading blocks the
	// worker's host tier holds (Worker.HostPrefix; 0 without one, or
	// where the profile's worker would not load them). Without a disk
	// tier the worker serves max(PrefixHitBlocks, HostHitBlocks) leading
	// blocks without computing them: PrefixHitBlocks from engine memory,
	// the rest loaded from host. 0 ≤ HostHitBlocks ≤ len(Request.PrefixHashes).
	HostHitBlocks int
	// DiskHitBlocks is the number of the request's leading blocks the
	// worker's disk tier holds (Worker.DiskPrefix; 0 without one, or
	// where the profile's worker would not load them, as HostHitBlocks).
	// The worker serves max(PrefixHitBlocks, HostHitBlocks,
	// DiskHitBlocks) leading blocks without computing them.
	// 0 ≤ DiskHitBlocks ≤ len(Request.PrefixHashes).
	DiskHitBlocks int
	// PeerHitBlocks is the number of the request's leading blocks the
	// deepest other worker holds in any tier of its cache, which this
	// worker may pull instead of computing them (from the token 0: a
	// pull brings the whole prefix); 0 where the worker does not pull
	// (Worker.PeerPullCost 0) or would not load them (as HostHitBlocks).
	// 0 ≤ PeerHitBlocks ≤ len(Request.PrefixHashes).
	PeerHitBlocks int
}

// Input is what a plugin knows of one routing cycle of one profile. The
// framework owns it; plugins read it and must not keep it.
type Input struct {
	// Now is the time of the routing cycle (the router's input, not a
	// clock read).
	Now     time.Time
	Profile string // "decode" or "prefill"
	Request Request
	// BlockTokens is the tokens per KV block (> 0).
	BlockTokens int
	// Blocks is the KV blocks the request takes on its decode worker:
	// ⌈(PromptTokens + MaxTokens) / BlockTokens⌉.
	Blocks int
	// Exclude holds the ids of workers the caller asks to skip (its
	// failed attempts). Read only; may be nil.
	Exclude map[string]bool
}

// Plugin is what every plugin has: a name, unique within its profile, for
// the timing metric and errors. Names are short lower-case words
// ("prefix", "queue").
type Plugin interface {
	Name() string
}

// Filter drops candidates that cannot take the request.
type Filter interface {
	Plugin
	// Filter returns the candidates of cs that pass, in their order. It
	// may reuse cs's backing array (the framework owns cs and does not
	// read it afterwards) and must not modify the Candidate values.
	Filter(in *Input, cs []Candidate) []Candidate
}

// Scorer rates candidates: higher is better.
type Scorer interface {
	Plugin
	// Score writes the score of cs[i] into scores[i], len(scores) ==
	// len(cs) ≥ 1. Scores lie in [0, 1]; the framework clamps others (NaN
	// counts as 0).
	Score(in *Input, cs []Candidate, scores []float64)
}

// Picker chooses one candidate from the weighted sums of the scores.
type Picker interface {
	Plugin
	// Pick returns the index in cs of the chosen candidate; totals[i] is
	// the weighted sum of cs[i]'s scores; len(cs) == len(totals) ≥ 1. It
	// must be deterministic: the same inputs give the same index.
	Pick(in *Input, cs []Candidate, totals []float64) int
}

// RelativeLoad writes 1 − load(c)/max into scores for each candidate c,
// where max is the largest load among cs and a negative load counts as
// 0: the least loaded scores highest, every score in [0, 1], all 1 when
// max is 0. Scorers of a load figure (queued tokens, running batch) share
// it.
func RelativeLoad(cs []Candidate, scores []float64, load func(Candidate) int) {
	top := 0
	for _, c := range cs {
		top = max(top, load(c))
	}
	for i, c := range cs {
		if top == 0 {
			scores[i] = 1
			continue
		}
		scores[i] = 1 - float64(max(load(c), 0))/float64(top)
	}
}
