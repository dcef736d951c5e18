package batch

import (
	"context"
	"errors"
	"github.com/pdserve/pdserve/pkg/grammar"
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

// Finish reasons of a choice.
const (
	FinishLength = vocab.FinishLength // max_tokens reached
	FinishStop   = vocab.FinishStop   // an end-of-generation token (unless ignore_eos) or a stop token
)

// Stamps the batch records in a request's Outbox.
const (
	StampKVFirstByte  = vocab.StampKVFirstByte
	StampKVDone       = vocab.StampKVDone
	StampPrefillStart = vocab.StampPrefillStart
	StampPrefillEnd   = vocab.StampPrefillEnd
	StampJoined       = vocab.StampDecodeJoined
	StampFirstToken   = vocab.StampFirstToken
)

// Outbox receives what the batch produces for one request (all its
// choices), from the loop goroutine. It must not block, nor call back into
// the batch; it is the only thing the batch shares with the service after
// a Join, so it is safe for concurrent use.
type Outbox interface {
	// Stamp records timestamp s for the next event.
	Stamp(s vocab.Stamp, t time.Time)
	// PrefixHit records the prompt tokens a local prefill took from the
	// prefix cache: host.Tokens of them loaded from its host (or disk)
	// tier, peer.Tokens pulled from a peer worker.
	PrefixHit(tokens int, host prefixcache.HostLoad, peer PeerLoad)
	// Token records output token t of choice i, produced in a step of
	// batch sequences, with its log-probability (nil: none asked). It
	// reports false, recording nothing, when the output waiting is over
	// its bound: the caller does not read (the batch then ends the
	// request, Stalled).
	Token(i int, t int32, lp *engine.TokenLogprob, batch int) bool
	// PromptLogprobs records the prompt's log-probabilities.
	PromptLogprobs(lps []engine.TokenLogprob)
	// ChoiceDone ends choice i with reason (requests of n > 1).
	ChoiceDone(i int, reason string)
}

// PeerLoad is what of a local prompt's prefix a sequence started from a
// peer's pull: tokens, and the pull's and import's time.
type PeerLoad struct {
	Tokens int
	Took   time.Duration
}

// Request is a request handed to the batch (Join): its Generate call's
// parameters, validated by the service. The batch owns it and everything
// it points to from the Join on (the grammar states included), but Out.
type Request struct {
	// Key names the request in messages and Ends: unique for the
	// worker's life (a request id may come back after its request
	// ended).
	Key uint64
	ID  string
	// Local: the batch prefills Prompt itself; otherwise its KV arrives
	// (Arrived) and the request joins once it did.
	Local     bool
	Prompt    []int32
	Sampling  engine.Sampling // Penalties are the weights; Constraint is set by the batch
	MaxTokens int
	IgnoreEOS bool
	Stop      map[int32]bool
	// Generated are choice 0's tokens streamed before a recovery,
	// GenChoices those of choices 1..N-1.
	Generated  []int32
	N          int
	GenChoices [][]int32
	// Top is the alternatives per output token (-1: no logprobs);
	// PromptTop per prompt token (-1: none; local prefill only).
	Top, PromptTop int
	// Hashes are the prompt's full blocks, for the prefix cache (nil:
	// off).
	Hashes []kv.Hash
	// Constraint is choice 0's grammar state, ForkStates those of
	// choices 1..N-1 (nil: no grammar).
	Constraint engine.GrammarState
	ForkStates []engine.GrammarState
	// Pin is the cached prefix pinned at Reserve for remote KV (Tokens
	// 0: none); the batch releases it.
	Pin prefixcache.Hit
	// Pulled is a local prompt's prefix pulled from a peer, Disk one
	// read from the disk tier (nil: none).
	Pulled *prefixcache.Pulled
	Disk   *prefixcache.DiskRead
	// KV is the remote KV received before the Join (nil: it comes
	// later, Arrived).
	KV  *KV
	Out Outbox
	// Priority is the request's class when the batch is full: waiting
	// interactive requests join before waiting batch ones
	// (Config.Overtakes).
	Priority vocab.Priority
}

// KV is a remote prefill's KV, received whole (Arrived): tokens
// [Start, Tokens) of each layer, frame by frame as sent (Ends[l] are the
// end tokens of layer l's frames, Layers[l] their bytes back to back),
// the prefix before Start coming from the Request's Pin. For a request
// with Generated tokens (a recovery or a migration), Tokens may go past
// the prompt over Generated but its last: the batch then computes only
// the generated tokens the KV lacks. The batch owns
// it from Arrived on and calls Free once it imported or dropped it.
type KV struct {
	Start, Tokens int
	Layers        [][]byte
	Ends          [][]int
	// First is the first token the prefill worker sampled, FirstLP its
	// log-probability (nil: not sent).
	First   int32
	FirstLP *engine.TokenLogprob
	// FirstByte and Done are when the first frame arrived and the last
	// was staged.
	FirstByte, Done time.Time
	// Unverified: the sender pulled part of this KV from a peer and did
	// not check it (the push's provenance). The sequence serves its own
	// request only: it never becomes a prefix cache entry, so the worker
	// neither advertises nor exports it.
	Unverified bool
	// Free releases the buffers' accounting (nil: nothing to do).
	Free func()
}

func (k *KV) free() {
	if k != nil && k.Free != nil {
		k.Free()
		k.Free = nil
	}
}

// Msg is a message to the batch: Join, Arrived, Cancel, Reclaimed or
// Export.
type Msg struct {
	join     *Request
	key      uint64
	kv       *KV
	cancel   bool
	err      error
	keep     bool
	reclaim  []engine.SeqID
	export   chan<- Exported
	ready    bool // export: when the request can move (ExportWhenReady)
	adopt    *prefixcache.Handover
	handover chan<- prefixcache.Handover
}

// Adopt hands the batch h, another batch's prefix cache on the same
// engine (an elastic worker's role change): its sequences become entries
// of the batch's cache (prefixcache.Cache.Adopt), counted against the
// engine's memory as the batch's own entries are, the least recently
// used beyond it evicted; the batch numbers its sequences after h's and
// reports the cache changed (the service charges its pool blocks). The
// batch owns h's sequences from the Post on. Post it before any Join.
func Adopt(h prefixcache.Handover) Msg { return Msg{adopt: &h} }

// HandOver asks the batch to hand its prefix cache's engine tier to to
// (prefixcache.Cache.Handover) when its loop stops, instead of freeing
// it; to must have room for the one Handover. The receiver owns its
// sequences then: it adopts (Adopt) or frees them.
func HandOver(to chan<- prefixcache.Handover) Msg { return Msg{handover: to} }

// Join hands r to the batch: it joins the batch once the batch has room
// for it (and, for remote KV, once its KV Arrived). The batch reports its
// end (End) exactly once.
func Join(r *Request) Msg { return Msg{join: r, key: r.Key} }

// Arrived hands request key's received KV to the batch, which imports it
// when the request joins, or frees it when the request ends.
func Arrived(key uint64, k *KV) Msg { return Msg{key: key, kv: k} }

// Cancel ends request key: when it was joined, the batch drops it and
// reports End{Kind: Cancelled, Err: err} (unless it ended already: then
// its own End stands); its engine sequence goes into the prefix cache
// with keep. A request never joined only has its Arrived KV freed, and
// no End.
func Cancel(key uint64, err error, keep bool) Msg {
	return Msg{key: key, cancel: true, err: err, keep: keep}
}

// Reclaimed hands the batch the engine sequences of prefix cache entries
// the service reclaimed, which it frees before anything joins.
func Reclaimed(seqs []engine.SeqID) Msg { return Msg{reclaim: seqs} }

// Export ends running request key as migrated: at the step boundary the
// batch snapshots its KV and the state its generation goes on from
// (Snapshot), sends it on reply (which must have room for one value: the
// loop never waits), and ends the request, reporting End{Kind: Migrated};
// its prompt's blocks go into the prefix cache. A request that cannot be
// moved now gets an error on reply and runs on: one that is not in the
// batch (ErrNotRunning: not joined, still prefilling, ended), has several
// choices or has produced no token yet (ErrNotMigratable), or whose KV
// the engine could not export (ends it Failed).
func Export(key uint64, reply chan<- Exported) Msg { return Msg{key: key, export: reply} }

// ExportWhenReady is Export for a drain that moves every request out: a
// request of one choice that is in the batch but cannot move yet (its
// KV not imported, still prefilling, no token yet) is exported at the
// first step boundary after it can, instead of answering ErrNotRunning;
// one that ends before answers ErrNotRunning then. A request not in the
// batch, or of several choices, answers at once as for Export.
func ExportWhenReady(key uint64, reply chan<- Exported) Msg {
	return Msg{key: key, export: reply, ready: true}
}

// Exported answers an Export: the snapshot, or why there is none.
type Exported struct {
	Snap *Snapshot
	Err  error
}

// Errors of an Export.
var (
	ErrNotRunning    = errors.New("batch: the request is not decoding here")
	ErrNotMigratable = errors.New("batch: the request cannot be migrated")
)

// Snapshot is a running request's state, from which another batch goes
// on generating (Join a Request with Generated = Tokens and KV = KV): the
// KV of its prompt and of every output token but the last (which is the
// next decode input, not yet computed), and its output tokens so far,
// those generated before a recovery included. Everything else a sampler
// needs follows from them: a draw depends only on the seed and the
// position (engine.Sample), penalties count Tokens, and a grammar state
// is advanced over Tokens by the service as for a recovery.
type Snapshot struct {
	ID     string
	Prompt []int32
	Tokens []int32
	KV     *KV
}

// Kind is how a request ended in the batch.
type Kind int

const (
	// Finished: every choice finished (Reason: that of the last).
	Finished Kind = iota
	// Cancelled: a Cancel message (Err: its error).
	Cancelled
	// Failed: the engine, an import or a fork failed (Err: why).
	Failed
	// Refused: choice Choice's grammar allowed no token (Err: the
	// state's refusal of the token sampled anyway; never sent).
	Refused
	// Stalled: the request's Outbox refused a token: its caller does not
	// read.
	Stalled
	// Stopped: the loop stopped.
	Stopped
	// Migrated: an Export took its snapshot; it goes on elsewhere.
	Migrated
)

// End is a request that ended in the batch, reported to the service
// (Config.Report): the batch holds nothing of it any more.
type End struct {
	Key    uint64
	ID     string
	Kind   Kind
	Reason string
	Err    error
	Choice int
	// Snap is a Migrated request's snapshot (also sent on its Export's
	// reply), so that the service holds it before it says the request
	// moved.
	Snap *Snapshot
}

// Load is the batch's occupancy at its last step boundary.
type Load struct {
	Running             int // sequences in the batch
	Waiting             int // requests ready to join, waiting for room (see Batch.Load)
	QueuedPrefillTokens int // local prefill tokens not yet computed
	// EngineTokens and EngineSeqs are the engine memory the batch has
	// committed: the live requests' footprints and the prefix cache's
	// sequences.
	EngineTokens, EngineSeqs int
	// Ended counts the requests that ended in the batch since it
	// started (reported or about to be).
	Ended uint64
}

// Config configures a Batch.
type Config struct {
	Engine engine.Engine
	// Cache is the prefix cache (nil: off); the batch inserts, forks and
	// frees its engine sequences.
	Cache *prefixcache.Cache
	// EOG are the end-of-generation tokens.
	EOG map[int32]bool
	// MaxBatch is the most sequences in a step, MaxBatchTokens the most
	// tokens, ChunkTokens the most prompt tokens of one sequence a step.
	MaxBatch, MaxBatchTokens, ChunkTokens int
	// CacheMaxTokens bounds an entry (the prefix cache's MaxTokens).
	CacheMaxTokens int
	// TokenBytes is the bytes of one token in one layer of imported KV.
	TokenBytes int
	// MemTokens and MemSeqs bound the engine's KV memory, in tokens and
	// sequences (0: no bound): see Batch.
	MemTokens, MemSeqs int
	// Overtakes is how many interactive requests in a row may join ahead
	// of an older waiting batch request (batching.Order); 0: none,
	// requests join in the order they became ready whatever their
	// priorities.
	Overtakes int
	// Signals wakes the loop (Mailbox posts) and is waited on.
	Signals *batching.Signals
	// Stopped ends the loop when it ends (nil: only Run's context).
	Stopped context.Context
	// Observe records each step's time and size (nil: nothing);
	// ObservePrefill the prompt tokens of a step that prefilled a local
	// prompt and its time (nil: nothing).
	Observe        func(d time.Duration, batch int)
	ObservePrefill func(tokens int, d time.Duration)
	// Report hands the service the requests that ended in the batch and
	// whether the prefix cache's tokens changed (its pool charge is to be
	// settled). Called from the loop, holding no lock of the batch; it may
	// take the service's lock, and must not wait for the loop.
	Report func(ends []End, cacheChanged bool)
	// Stop is called once when the loop ends, before it reports every
	// request it holds as Stopped: the service refuses new requests and
	// ends those it holds that were never joined.
	Stop func()
	Log  *zap.Logger
	Now  func() time.Time
	// Grammars computes the choices' grammar states off the loop (nil:
	// states computed in place are always ready; see grammargate.go).
	Grammars *grammar.Offload
}

// Batch is the decode worker's continuous batching: requests join at
// step boundaries while the batch has room, interactive ones first
// (Config.Overtakes), their KV imported then, or their prompt prefilled
// in chunks beside the decodes; every running sequence decodes one token
// a step. It owns every sequence and its
// engine memory: only its loop goroutine (Run) touches them, and it takes
// no lock. Others talk to it by Post (Join, Arrived, Cancel, Reclaimed,
// Export, Adopt, HandOver), drained at each step boundary, and hear back
// through each request's Outbox and Config.Report.
//
// Engine memory is one decision, taken when a request joins: it joins
// only when its whole footprint (n × (prompt + max_tokens) tokens, which
// covers a prefix forked from the cache, a host- or disk-tier load, a
// peer's pull and an import, all inside its own sequences) fits beside
// the live requests' footprints and the prefix cache's engine sequences
// (evicting unpinned entries, least recently used first, as needed). A
// cache handed over from another role's batch (Adopt) counts the same:
// what does not fit beside the live requests goes at once.
// Otherwise it waits for live requests to end and pins to go; a request
// that finds the engine empty starts anyway, and the engine refuses what
// it cannot hold.
type Batch struct {
	cfg  Config
	run  *runner.Runner[*seq]
	box  *batching.Mailbox[Msg]
	load atomic.Pointer[Load]
	// posted counts the messages posted and not yet published as taken
	// that make a request ready to join (a local Join, a remote one with
	// its KV, an Arrived): Load counts them as waiting.
	posted atomic.Int64

	// The loop's alone.
	joins   map[uint64]*seq // every joined root, until its end is reported
	arrived map[uint64]*KV  // KV that arrived before its Join
	// parked are the ExportWhenReady replies of requests that cannot
	// move yet, by key; each is answered at a step boundary.
	parked  map[uint64]chan<- Exported
	waiting []*seq         // ready to join, in order of readiness (they join by priority: plan)
	order   batching.Order // the order waiting requests join in
	active  []*seq         // in the batch, in order of joining
	nextSeq engine.SeqID
	// cached is the engine tokens of each prefix cache entry's sequence
	// the batch inserted and has not freed; cachedTokens their sum.
	cached       map[engine.SeqID]int
	cachedTokens int
	// liveTokens and liveSeqs are the footprints of the started requests.
	liveTokens, liveSeqs int
	ends                 []End
	endCount             uint64
	taken                int64 // ready messages taken since the last publish
	cacheChanged         bool
	// handTo receives the cache's engine tier at the stop (HandOver;
	// nil: it is freed).
	handTo chan<- prefixcache.Handover
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
		cfg:     cfg,
		box:     batching.NewMailbox[Msg](cfg.Signals),
		joins:   make(map[uint64]*seq),
		arrived: make(map[uint64]*KV),
		parked:  make(map[uint64]chan<- Exported),
		cached:  make(map[engine.SeqID]int),
		order:   batching.Order{Overtakes: cfg.Overtakes},
	}
	b.load.Store(&Load{})
	b.run = runner.New(cfg.Engine, runner.Policy[*seq](policy{b}), cfg.Signals, runner.Options{
		Role:    "decode",
		Stopped: cfg.Stopped,
		Observe: cfg.Observe,
		Now:     cfg.Now,
	})
	return b
}

// Post hands m to the batch, which takes it at its next step boundary.
// Safe from any goroutine, under any lock: it never waits for the loop.
func (b *Batch) Post(m Msg) {
	if m.readies() {
		b.posted.Add(1)
	}
	b.box.Post(m)
}

// readies reports whether m makes a request ready to join.
func (m Msg) readies() bool {
	return m.join != nil && (m.join.Local || m.join.KV != nil) || m.kv != nil
}

// Run runs the loop until ctx or Config.Stopped ends, then reports every
// request it holds as Stopped and frees the engine's sequences. It
// returns nil after a stop, or an error when Run was called before.
func (b *Batch) Run(ctx context.Context) error { return b.run.Run(ctx) }

// Load returns the occupancy at the last step boundary, counting as
// waiting too the requests whose Join (and KV) were posted since (for a
// moment at a boundary, some may be counted twice). Safe from any
// goroutine.
func (b *Batch) Load() Load {
	ld := *b.load.Load()
	ld.Waiting += int(b.posted.Load())
	return ld
}

// Steps returns the recent step times in milliseconds (a copy) and the
// last step's size. Safe from any goroutine.
func (b *Batch) Steps() (timesMs []float64, lastBatch int) { return b.run.Steps() }

// LockEngine waits for the step in progress to end and keeps the loop
// from starting another until UnlockEngine: for a reader of the engine
// outside the loop (a peer's export of a cached prefix), which must not
// change any sequence.
func (b *Batch) LockEngine() { b.run.LockEngine() }

// UnlockEngine lets the loop go on after LockEngine.
func (b *Batch) UnlockEngine() { b.run.UnlockEngine() }
