package batch

import (
	"context"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/batching"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/runner"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// Admit is the service's answer when the batch is about to start a
// request (Outbox.Start).
type Admit int

const (
	// Go: the service holds the request's KV buffer and transfer; the
	// batch starts it.
	Go Admit = iota
	// Wait: the service's own bound (its retained KV) has no room yet;
	// the request, and every other waiting one, waits.
	Wait
	// Gone: the service ended the request (its Cancel is on its way); the
	// batch drops it.
	Gone
)

// Outbox receives what the batch produces for one request, from the loop
// goroutine. Its methods must not block on the loop nor call back into
// the batch (Post aside); they may take the service's lock.
type Outbox interface {
	// Start is called once the engine's memory holds the request, before
	// anything is allocated for it in the engine.
	Start() Admit
	// Prefix hands over the KV of the prompt's prefix the request started
	// from (a fork from the prefix cache, a host- or disk-tier load, a
	// peer's pull): one chunk per layer, tokens [0, n). The chunks are
	// the caller's until Prefix returns. An error drops them (the
	// service keeps nothing of them): the batch then computes the whole
	// prompt.
	Prefix(chunks []engine.KVChunk) error
	// KV hands over a chunk the engine computed, during the step; its
	// Data is valid only during the call. An error fails the step.
	KV(c engine.KVChunk) error
	// End ends the request in the batch: it holds nothing of it any
	// more. Called once per request, unless a Cancel took it out first.
	End(e End)
}

// Request is a Prefill call handed to the batch (Join), validated by
// the service. The batch owns it and what it points to from the Join on
// (the grammar state included), but Out.
type Request struct {
	// Key names the request in messages: unique for the worker's life (a
	// request id may come back after its request ended).
	Key    uint64
	ID     string
	Prompt []int32
	// Grammar is the grammar state of structured output, also
	// Sampling.Constraint (nil: none); the batch closes it once the first
	// token is sampled or the request ends.
	Sampling engine.Sampling
	Grammar  engine.GrammarState
	// Hashes are the prompt's full blocks, for the prefix cache (nil: off).
	Hashes []kv.Hash
	// Pulled is the prefix pulled from a peer before the Join, Disk the
	// one read from the disk tier (nil: none); imported, or not, when the
	// request starts.
	Pulled *prefixcache.Pulled
	Disk   *prefixcache.DiskRead
	Out    Outbox
	// Priority is the request's class in the queue: waiting interactive
	// requests start before waiting batch ones (Config.Overtakes).
	Priority vocab.Priority
}

// Kind is how a request ended in the batch.
type Kind int

const (
	// Prefilled: every chunk ran; End.Token is the first token.
	Prefilled Kind = iota
	// Failed: the step failed (Err: why).
	Failed
	// Refused: the grammar allowed no first token (Err: the state's
	// refusal of End.Token, sampled anyway; never to be sent).
	Refused
	// Stopped: the loop stopped (Err: why, when a step was cut short).
	Stopped
)

// Hits is what of a prompt a request did not compute: Prefix tokens
// taken from the prefix cache, Host of them loaded from its host tier
// (Disk of those from the disk tier) in HostLoad, Peer pulled from a
// peer and imported in PeerLoad.
type Hits struct {
	Prefix, Host, Disk, Peer int
	HostLoad, PeerLoad       time.Duration
}

// End is a request that ended in the batch.
type End struct {
	Kind Kind
	Err  error
	// Token is the first token (Prefilled, Refused); Logits the logits it
	// was sampled from (nil when the engine computes none), valid only
	// during Outbox.End.
	Token  int32
	Logits []float32
	// Start is when the request's first step started, Done when its last
	// ended; Batch the size of that step.
	Start, Done time.Time
	Batch       int
	Hits        Hits
	// Source is the peer the prompt's prefix came from ("" when computed
	// here or from this worker's own cache of its own KV); Unverified is
	// set when that prefix was pulled without passing the spot check
	// (Prefilled only: the service marks the KV push's provenance).
	Source     string
	Unverified bool
}

// Msg is a message to the batch: Join, Cancel, Purge, Adopt or HandOver.
type Msg struct {
	join     *Request
	key      uint64
	cancel   bool
	purge    string
	adopt    *prefixcache.Handover
	handover chan<- prefixcache.Handover
}

// Adopt hands the batch h, another batch's prefix cache on the same
// engine (an elastic worker's role change): its sequences become entries
// of the batch's cache (prefixcache.Cache.Adopt), which counts them
// against the engine's memory as it counts its own, evicting the least
// recently used beyond it; the batch numbers its sequences after h's.
// The batch owns h's sequences from the Post on. Post it before any Join.
func Adopt(h prefixcache.Handover) Msg { return Msg{adopt: &h} }

// HandOver asks the batch to hand its prefix cache's engine tier to to
// (prefixcache.Cache.Handover) when its loop stops, instead of freeing
// it; to must have room for the one Handover. The receiver owns its
// sequences then: it adopts (Adopt) or frees them.
func HandOver(to chan<- prefixcache.Handover) Msg { return Msg{handover: to} }

// Join hands r to the batch: it waits, in the order of its Priority
// (Config.Overtakes), until the engine has room for it, then is
// prefilled in chunks. The batch ends it (Outbox.End) exactly once,
// unless a Cancel comes first.
func Join(r *Request) Msg { return Msg{join: r, key: r.Key} }

// Cancel takes request key out of the batch (its engine sequence is
// freed, its grammar state closed) without an End: the service ended it.
// A request that ended in the batch already is not touched.
func Cancel(key uint64) Msg { return Msg{key: key, cancel: true} }

// Purge drops what the prefix cache holds from peer (whose pulled KV
// failed a spot check): the entries tagged with it, and their engine
// sequences.
func Purge(peer string) Msg { return Msg{purge: peer} }

// Load is the batch's occupancy at its last step boundary.
type Load struct {
	// Queued is the requests waiting or being prefilled,
	// QueuedPrefillTokens their prompt tokens not yet prefilled.
	Queued, QueuedPrefillTokens int
	// EngineTokens and EngineSeqs are the engine memory the started
	// requests' whole prompts take.
	EngineTokens, EngineSeqs int
}

// Config configures a Batch.
type Config struct {
	Engine engine.Engine
	// Cache is the prefix cache (nil: off); the batch looks up, forks,
	// inserts and frees its engine sequences.
	Cache *prefixcache.Cache
	// MaxBatchTokens is the most tokens in a step, ChunkTokens the most
	// prompt tokens of one request in a step.
	MaxBatchTokens, ChunkTokens int
	// MemTokens and MemSeqs bound the engine's KV memory, in tokens and
	// sequences (0: no bound): see Batch.
	MemTokens, MemSeqs int
	// Overtakes is how many interactive requests in a row may start
	// ahead of an older waiting batch request (batching.Order); 0: none,
	// the queue is first come first served whatever the priorities.
	Overtakes int
	// Signals wakes the loop (Post) and is waited on.
	Signals *batching.Signals
	// Stopped ends the loop when it ends (nil: only Run's context).
	Stopped context.Context
	// Observe records each step's time and size (nil: nothing);
	// ObservePrefill the prompt tokens a step computed and its time (nil:
	// nothing).
	Observe        func(d time.Duration, batch int)
	ObservePrefill func(tokens int, d time.Duration)
	// Stop is called once when the loop ends, before the batch ends every
	// request it holds as Stopped: the service refuses new requests
	// (posts no Join after it returns).
	Stop func()
	Log  *zap.Logger
	Now  func() time.Time
}

// Batch is the prefill worker's chunked prefill, first come first served
// within a priority (Config.Overtakes). It owns every request's engine
// sequence and the engine's memory: only its loop goroutine (Run)
// touches them, and it takes no lock. Others talk to it
// by Post (Join, Cancel, Purge), drained at each step boundary, and hear
// back through each request's Outbox.
//
// Engine memory is one decision, taken when a request starts: it starts
// only when its whole footprint fits beside the live requests' prompts
// and the prefix cache entries that cannot be evicted (pinned: by a
// peer's export). Its footprint is its prompt, whichever way it starts
// (a fork, a host- or disk-tier load and a peer pull put at most its
// prompt's tokens into its own sequence), and, for a fork, the entry it
// forks from, which stays in the engine while the fork copies it. Then
// the least recently used unpinned entries are evicted until the live
// sequences, the new prompt and the cache fit the engine's memory (a
// cache handed over from another role's batch, Adopt, counts the same:
// what does not fit beside the started requests goes at once). A
// fork whose source does not fit waits for the live requests, or, with
// none live, is not made (the prompt is computed). A request that finds
// the engine empty starts anyway: the engine refuses only a prompt
// larger than its whole memory.
type Batch struct {
	cfg  Config
	spec engine.ModelSpec
	run  *runner.Runner[*seq]
	box  *batching.Mailbox[Msg]
	load atomic.Pointer[Load]
	// postedReqs and postedTokens count the Joins posted and not yet
	// published as taken, and their prompt tokens: Load counts them as
	// queued.
	postedReqs, postedTokens atomic.Int64

	// The loop's alone.
	queue                  []*seq          // prefilling in the order they started, then waiting in the order they joined
	order                  batching.Order  // the order waiting requests start in
	byKey                  map[uint64]*seq // the queue by key
	nextSeq                engine.SeqID
	kvErr                  error // why the last step's KV callback failed, for its log
	takenReqs, takenTokens int64 // Joins taken since the last publish
	// handTo receives the cache's engine tier at the stop (HandOver;
	// nil: it is freed).
	handTo chan<- prefixcache.Handover
}

// seq is a request in the batch.
type seq struct {
	r       *Request
	started bool // has an engine sequence; the service holds its KV buffer
	id      engine.SeqID
	done    int // prompt tokens prefilled, the prefix taken included
	hits    Hits
	// source is the provenance of the prefix the request started from:
	// "" computed here, else the peer it was pulled from (directly, or
	// through a cache entry of such a pull); unverified is set when that
	// pull was not spot-checked: the sequence then serves this request
	// only and is never cached.
	source     string
	unverified bool
	startedAt  time.Time
}

// New returns a Batch; it does not run until Run.
func New(cfg Config) *Batch {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	b := &Batch{
		cfg:   cfg,
		spec:  cfg.Engine.Spec(),
		box:   batching.NewMailbox[Msg](cfg.Signals),
		byKey: make(map[uint64]*seq),
		order: batching.Order{Overtakes: cfg.Overtakes},
	}
	b.load.Store(&Load{})
	b.run = runner.New(cfg.Engine, runner.Policy[*seq](policy{b}), cfg.Signals, runner.Options{
		Role:        "prefill",
		PrefillOnly: true,
		Stopped:     cfg.Stopped,
		Observe:     cfg.Observe,
		Now:         cfg.Now,
	})
	return b
}

// Post hands m to the batch, which takes it at its next step boundary.
// Safe from any goroutine, under any lock: it takes only the mailbox's
// leaf lock and never waits for the loop.
func (b *Batch) Post(m Msg) {
	if m.join != nil {
		b.postedReqs.Add(1)
		b.postedTokens.Add(int64(len(m.join.Prompt)))
	}
	b.box.Post(m)
}

// Run runs the loop until ctx or Config.Stopped ends, then ends every
// request it holds as Stopped and frees the engine's sequences. It
// returns nil after a stop, or an error when Run was called before.
func (b *Batch) Run(ctx context.Context) error { return b.run.Run(ctx) }

// Load returns the occupancy at the last step boundary, counting as
// queued too the requests whose Join was posted since (for a moment at a
// boundary, some may be counted twice). Safe from any goroutine.
func (b *Batch) Load() Load {
	ld := *b.load.Load()
	ld.Queued += int(b.postedReqs.Load())
	ld.QueuedPrefillTokens += int(b.postedTokens.Load())
	return ld
}

// Steps returns the recent step times in milliseconds (a copy) and the
// last step's size. Safe from any goroutine.
func (b *Batch) Steps() (timesMs []float64, lastBatch int) { return b.run.Steps() }

// LockEngine waits for the step in progress to end and keeps the loop
// from starting another until UnlockEngine: for a reader of the engine
// outside the loop (a peer's export of a cached prefix, a spot check of
// pulled KV), which must not change any sequence of the batch.
func (b *Batch) LockEngine() { b.run.LockEngine() }

// UnlockEngine lets the loop go on after LockEngine.
func (b *Batch) UnlockEngine() { b.run.UnlockEngine() }
