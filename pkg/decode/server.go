package decode

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/batching"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/grammar"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/runner"
	"github.com/pdserve/pdserve/pkg/tracing"
	"github.com/pdserve/pdserve/pkg/wire"
)

// Finish reasons of the last GenerateResponse.
const (
	FinishLength = "length" // max_tokens reached
	FinishStop   = "stop"   // an end-of-generation token (unless ignore_eos) or a stop token
)

// Stamp names of GenerateResponse events.
const (
	StampKVFirstByte  = "kv_first_byte"
	StampKVDone       = "kv_done"
	StampPrefillStart = "prefill_start"
	StampPrefillEnd   = "prefill_end"
	StampJoined       = "decode_joined"
	StampFirstToken   = "first_token"
	StampLastToken    = "last_token"
)

const maxRequestID = 255 // longest request id a KV frame can carry

// errStopped fails requests still live when the scheduler stops.
var errStopped = status.Error(codes.Unavailable, "decode: worker stopping")

// Server is a decode (or colocated) worker. Create it with New, register it
// on a gRPC server with Register (DecodeService and the KV transfer
// receiver), and run the scheduler with Run.
type Server struct {
	pdservev1.UnimplementedDecodeServiceServer

	eng  engine.Engine
	spec engine.ModelSpec
	// eog holds the end-of-generation ids: engine.EOGTokens of the
	// engine's tokenizer and the spec's EOS. Built once; read only.
	eog map[int32]bool
	// grammars makes the grammar states of structured output (the
	// engine's own sampler, or the Go mask).
	grammars *grammar.Source
	pool     *kv.Pool
	o        Options
	log      *zap.Logger
	m        *metrics
	now      func() time.Time
	// afterFunc arms the reservation timers (time.AfterFunc; tests inject
	// a fake). It must not call f synchronously.
	afterFunc func(d time.Duration, f func()) timer

	// sig wakes the scheduler, and holds draining and the end of each
	// request (its ...Locked methods under mu).
	sig     *batching.Signals
	baseCtx context.Context
	stop    context.CancelFunc

	// tokenBytes is the bytes of one token in one layer of the KV the
	// engine imports: its KVTokenBytes() when it has that method (a
	// performance-model engine moving a scaled-down payload), else the
	// spec's.
	tokenBytes int
	// stagedBytes counts the bytes of KV received and not yet imported
	// into the engine (see staging).
	stagedBytes atomic.Int64
	// kvSaved counts the KV bytes (the model's true size) prefill workers
	// did not send because this worker held the prefix (transfers that
	// started after token 0).
	kvSaved atomic.Int64

	// cache holds finished requests' engine sequences for prefix reuse
	// (nil: off; safe for concurrent use, its lock a leaf). Lookups pin
	// entries in the service (Reserve) or the runner (local join); forks,
	// inserts and frees of its sequences are the runner's, under the engine
	// lock. Its tokens share the pool with requests, and the pool charge is
	// the service's, guarded by mu: cacheBlocks are the pool blocks charged
	// to them now (BlocksFor the cache's tokens, see chargeCacheLocked),
	// settled by the service after the runner inserted entries (handOff),
	// and a request short of blocks reclaims unpinned entries
	// (allocateLocked), whose engine sequences it hands to the runner
	// (rn.reclaimed).
	cache       *prefixcache.Cache
	cacheBlocks []kv.BlockID
	// peers prices a local prefill's pull of its prefix from a peer
	// worker (GenerateRequest.peer); dialer pulls it (nil: no pulls, see
	// WithDialer).
	peers  *kvtransfer.PullPricer
	dialer *kvtransfer.Dialer

	// run is the batch loop, under the policy batcher. Its engine lock
	// guards eng: the loop holds it for a whole step (importing the KV of
	// joining sequences, planning, running, handing out results); ending
	// a request that holds an engine sequence takes it (run.LockEngine)
	// to free that sequence. The KV receiver and the reservation timers
	// never take it. Taken before mu (see the package doc for the lock
	// order).
	run *runner.Runner[*sequence]

	// offload computes the grammar states of the batch's choices off the
	// engine loop (grammargate.go).
	offload *grammar.Offload

	// rn is the runner's state (the batch, its waiting queue, the
	// sequences' sched), under its own lock (taken after mu, before
	// rx.mu).
	rn runState

	// rx is the KV receiver's state, under its own lock (taken after
	// mu and rn.mu, never before).
	rx rxState

	// mu is the service's: it guards the reservations and calls, the
	// per-caller caps and the pool's charge to the prefix cache.
	mu      sync.Mutex
	seqs    map[string]*sequence // every reserved or live request, by id
	stopped bool
	callers map[string]*callerUse // what each caller's requests hold (see Options.MaxReservationsPerCaller)
}

// callerUse is what one caller's live requests hold. Guarded by
// Server.mu.
type callerUse struct {
	requests int // reserved or live requests
	tokens   int // KV tokens of their blocks
}

// timer is the part of *time.Timer the reservation timers use.
type timer interface{ Stop() bool }

func realAfterFunc(d time.Duration, f func()) timer { return time.AfterFunc(d, f) }

// sequence is one request on this worker, from Reserve (or Generate) to
// its end, or one choice of it. Its state is split by owner, the party
// that writes it: the service (Reserve, Generate, Cancel, the caps and
// timers: reservation, call), the KV receiver (kvIn) and the runner
// (sched). reservation, call and done are guarded by Server.mu (call does
// not change once the sequence is handed to the runner, which reads it
// then), kvIn by Server.rx.mu, sched by Server.rn.mu, the engine sequence
// by the runner's engine lock. done is the request's end in the service
// (endLocked), which any party may cause; the runner's part of it is
// sched.dropped.
type sequence struct {
	reservation
	kvIn
	call
	sched
	done bool
	// pulling: a local prefill's Generate call is pulling the prompt's
	// prefix from a peer; the sequence is ready to join the batch only
	// once the pull ended (pullDone). Guarded by Server.mu.
	pulling bool
}

// reservation is what the service holds for a request from Reserve (or a
// Generate without one) to its end: pool blocks charged to its caller,
// the reservation timer, and the prefix cache pin of Reserve (until the
// sequence is handed to the runner: sched.pin).
type reservation struct {
	id        string
	blocks    []kv.BlockID
	resTokens int    // tokens the blocks hold
	ttl       timer  // releases an unclaimed reservation; nil once claimed
	caller    string // who made the request (grpcauth.Caller); charged with its blocks
	// hit is the cached prefix pinned at Reserve for the remote KV
	// (Tokens 0: none), handed to the runner (sched.pin) when the
	// sequence queues to join the batch, or released when the request
	// ends before.
	hit prefixcache.Hit
	// resPrompt is the prompt Reserve was shown (ReserveRequest.prompt),
	// or nil: a Generate call that omits its prompt takes this one.
	resPrompt []int32
}

// kvIn is the KV transfer of a remote prefill, written by the KV
// receiver (Begin, Commit, Abort, the first Write); the runner takes
// staged over when the sequence joins. Guarded by Server.rx.mu. The
// service writes what a transfer may be (limit, hitTokens, the claim) and
// ended through the hand-offs of rxState; first, firstLP, firstByte,
// kvDone and kvTokens do not change once committed.
type kvIn struct {
	// What the service admits: the reserved tokens, the cached prefix
	// pinned at Reserve, and, once a Generate call claimed the request,
	// whether it prefills locally and its prompt's length. ended: the
	// request ended (no transfer may begin or go on).
	limit       int
	hitTokens   int
	claimed     bool
	claimLocal  bool
	claimPrompt int
	ended       bool

	sink      *sink    // the open transfer, or nil
	staged    *staging // KV received (committed) and not yet imported, or nil
	xferErr   error    // why the last transfer failed, until another begins
	committed bool
	kvTokens  int
	first     int32                   // first token from the commit
	firstLP   *pdservev1.TokenLogprob // its log-probability from the commit, or nil
	firstByte time.Time
	kvDone    time.Time
}

// call is the Generate call's request, set once by the service when the
// call attaches (the runner sets a choice's copy when it forks); read
// only afterwards.
type call struct {
	attached  bool
	local     bool
	prompt    []int32
	sampling  engine.Sampling
	maxTokens int
	ignoreEOS bool
	stop      map[int32]bool
	generated []int32 // tokens streamed before a recovery
	out       *outbox // shared by every choice of the request
	// hashes are the prompt's full blocks, for the prefix cache (nil when
	// it is off).
	hashes []kv.Hash

	// Choices (n > 1). The request's first choice (index 0, the root)
	// holds the reservation, the transfer and the outbox; the others
	// (children) are forked from its prompt KV once that is in the engine
	// and hold only their engine sequence. Only roots are in seqs and
	// waiting; children are in active.
	index      int
	n          int       // choices (root)
	genChoices [][]int32 // tokens generated before a recovery, choices 1..n-1 (root)

	top       int // alternatives per output token; -1: no logprobs
	promptTop int // alternatives per prompt token (root, local prefill); -1: none
}

// sched is the runner's, guarded by Server.rn.mu: the engine sequence,
// the choices it forked, the batch membership, and the generation's
// progress. The service queues the sequence (readyLocked) and drops it at
// the request's end (drop), under rn.mu, and the grammar state
// and penalties are built by the service at attach, then advanced by the
// runner only.
type sched struct {
	seq    engine.SeqID
	hasSeq bool // the engine may hold the sequence: Free it at the end; set only by the runner, holding the engine lock
	// pin is Reserve's cached prefix (reservation.hit), handed over when
	// the sequence queued; importJoining takes it, or the drop releases it.
	pin prefixcache.Hit
	// dropped: the request ended for the runner (root): its choices'
	// engine sequences and batch slots are freed, and it never joins.
	dropped bool

	// host is the local prompt's prefix loaded from the host tier (or
	// the disk tier behind it; Tokens 0: none).
	host prefixcache.HostLoad
	// pulled is the local prompt's prefix pulled from a peer before the
	// sequence was ready (nil: none), until the sequence starts
	// (forkCachedLocked); peer is what of it the sequence started from
	// (tokens 0: none).
	pulled *prefixcache.Pulled
	peer   peerLoad
	// disk is the local prompt's prefix the disk tier held deeper than
	// the other tiers, read from its file in Generate, off the engine
	// lock (nil: none), until the sequence starts (forkCachedLocked).
	disk *prefixcache.DiskRead

	parent     *sequence   // the root (children), nil for a root
	children   []*sequence // created at the fork (root)
	forked     bool        // the children were created (root)
	choiceDone bool        // this choice finished; its engine sequence is freed

	promptLPs []*pdservev1.TokenLogprob
	filled    int               // tokens of pending already prefilled (for prompt logprobs)
	penalties *engine.Penalties // the choice's penalty counts, or nil
	// constraint is the choice's grammar state (structured output),
	// advanced over every token it emits, closed when the choice is
	// dropped; nil when unconstrained.
	constraint engine.GrammarState
	// forkStates are the grammar states of choices 1..n-1 (root),
	// built with the request's one compiled grammar when it arrived, off
	// the engine loop; the fork takes each, and dropLocked closes those
	// it did not.
	forkStates []engine.GrammarState

	queued      bool    // in waiting
	joined      bool    // in active
	pending     []int32 // tokens still to prefill locally
	sampleLast  bool    // the last pending chunk samples the first output token
	prefilling  bool    // a local prefill chunk ran already
	next        int32   // next decode input, once pending is empty
	emitted     int     // output tokens so far, generated ones included
	firstStamps bool    // "first_token" was stamped
}

// Option configures a Server beyond its Options.
type Option func(*Server)

// WithDialer gives the worker the dialer its local prefills pull a
// prompt's cached prefix from a peer worker with (GenerateRequest.peer:
// kvtransfer.Dialer.Pull, with the pull's TLS checks and credential).
// Without it the worker pulls nothing. The caller closes d after the
// Server stopped.
func WithDialer(d *kvtransfer.Dialer) Option { return func(s *Server) { s.dialer = d } }

// New returns a Server running on eng with a pool of o.KVBlocks blocks. reg
// receives the worker's metrics (nil: none are exported). The scheduler does
// not run until Run is called.
func New(eng engine.Engine, o Options, logger *zap.Logger, reg prometheus.Registerer, opts ...Option) (*Server, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	spec := eng.Spec()
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	pool, err := kv.NewPool(o.KVBlocks, o.BlockTokens)
	if err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	ctx, stop := context.WithCancel(context.Background())
	tokenBytes := spec.KVTokenBytes()
	if e, ok := eng.(interface{ KVTokenBytes() int }); ok && e.KVTokenBytes() > 0 {
		tokenBytes = e.KVTokenBytes()
	}
	eog := make(map[int32]bool)
	for _, t := range append(engine.EOGTokens(eng.Tokenizer()), spec.EOS) {
		if t >= 0 {
			eog[t] = true
		}
	}
	s := &Server{
		eng:        eng,
		spec:       spec,
		eog:        eog,
		grammars:   grammar.ForEngine(eng),
		tokenBytes: tokenBytes,
		pool:       pool,
		o:          o,
		log:        logger,
		now:        time.Now,
		afterFunc:  realAfterFunc,
		sig:        batching.NewSignals(),
		baseCtx:    ctx,
		stop:       stop,
		seqs:       make(map[string]*sequence),
		callers:    make(map[string]*callerUse),
		peers:      kvtransfer.NewPullPricer(o.PeerLinkGbps),
	}
	for _, opt := range opts {
		opt(s)
	}
	// Auto: the whole pool, since cached blocks yield to requests; an
	// engine that cannot fork keeps none (a size asked for is an error).
	_, forks := eng.(engine.Forker)
	auto := o.KVBlocks * o.BlockTokens
	if !forks && o.PrefixCache.MaxTokens == prefixcache.Auto {
		auto = 0
	}
	s.o.PrefixCache = o.PrefixCache.Resolve(auto)
	if s.cache, err = prefixcache.New(s.o.cacheOptions()); err != nil {
		stop()
		return nil, fmt.Errorf("decode: %w", err)
	}
	if s.cache != nil && !forks {
		stop()
		return nil, errors.New("decode: a prefix cache needs an engine that forks sequences")
	}
	if s.m, err = newMetrics(reg, s); err != nil {
		stop()
		return nil, err
	}
	s.offload = grammar.NewOffload(grammarWorkers(), s.sig.Wake)
	s.run = runner.New(eng, runner.Policy[*sequence](batcher{s}), s.sig, runner.Options{
		Role:    "decode",
		Stopped: ctx,
		Observe: s.m.observeStep,
		Now:     func() time.Time { return s.now() },
	})
	return s, nil
}

// Register registers DecodeService and the KV transfer receiver on g (which
// also serves peers' pulls of its cached prefixes), with the transfer
// server options opts. The receiver takes KV of the engine's
// KV dtype only.
func (s *Server) Register(g *grpc.Server, opts ...kvtransfer.ServerOption) {
	pdservev1.RegisterDecodeServiceServer(g, s)
	kvtransfer.Register(g, receiver{s}, s.spec.KVDType, append(opts, kvtransfer.WithPullSource(s))...)
}

// Stats is a snapshot of the worker's load, for heartbeats.
type Stats struct {
	KVBlocksFree, KVBlocksTotal int
	Running                     int       // sequences in the batch
	Waiting                     int       // sequences ready to join, waiting for a slot
	Requests                    int       // reserved or live requests
	QueuedPrefillTokens         int       // local prefill tokens not yet computed
	StagedKVBytes               int64     // KV received and not yet imported into the engine
	KVTransfers                 int       // requests whose KV is arriving now (an open transfer)
	LastBatch                   int       // sequences in the last step
	StepTimesMs                 []float64 // recent step times, oldest first; a copy
	Draining                    bool
	// PrefixCache is the prefix cache's counters and occupancy (zero when
	// off). KVBlocksFree counts the blocks of its unpinned entries as
	// free: a request reclaims them.
	PrefixCache prefixcache.Stats
	// KVBytesSaved is the KV (true size, bytes) prefill workers did not
	// send thanks to this worker's prefix cache.
	KVBytesSaved int64
}

// PrefixDigest returns at most n block hashes of the prefix cache, most
// recently used first (see prefixcache.Cache.Digest), for heartbeats; nil
// when the cache is off or empty. The caller owns the slice.
func (s *Server) PrefixDigest(n int) []uint64 { return s.cache.Digest(n) }

// PrefixBlocks returns the prefix cache's blocks, to observe (SetObserver)
// and list them (AppendBlocks) for KV events; nil when the cache is off.
func (s *Server) PrefixBlocks() prefixcache.Blocks {
	if s.cache == nil {
		return nil
	}
	return s.cache
}

// HostBlocks returns the prefix cache's host tier's blocks, for its own KV
// events (control.KVTierHost); nil when it has none.
func (s *Server) HostBlocks() prefixcache.Blocks {
	if s.cache.Host() == nil {
		return nil
	}
	return s.cache.Host()
}

// Stats returns a snapshot of the worker's load.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	times, last := s.run.Steps()
	st := Stats{
		KVBlocksFree:  s.freeBlocksLocked(),
		KVBlocksTotal: s.pool.Total(),
		Requests:      len(s.seqs),
		LastBatch:     last,
		StepTimesMs:   times,
		StagedKVBytes: s.stagedBytes.Load(),
		Draining:      s.sig.DrainingLocked(),
		PrefixCache:   s.cache.Stats(),
		KVBytesSaved:  s.kvSaved.Load(),
	}
	st.KVTransfers = s.rx.transfers()
	s.rn.mu.Lock()
	defer s.rn.mu.Unlock()
	st.Running, st.Waiting = len(s.rn.active), len(s.rn.waiting)
	for _, q := range s.rn.active {
		st.QueuedPrefillTokens += len(q.pending)
	}
	for _, q := range s.rn.waiting {
		if q.local {
			st.QueuedPrefillTokens += len(q.prompt) + max(len(q.generated)-1, 0)
		}
	}
	return st
}

// SetDraining marks the worker draining: Reserve, and Generate without a
// reservation, fail with UNAVAILABLE; reserved and live requests finish.
func (s *Server) SetDraining(d bool) {
	s.mu.Lock()
	s.sig.SetDrainingLocked(d)
	s.mu.Unlock()
}

// WaitIdle blocks until no request is reserved or live, or ctx ends
// (returning its error).
func (s *Server) WaitIdle(ctx context.Context) error {
	return s.sig.WaitIdle(ctx, &s.mu, func() int { return len(s.seqs) })
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "decode: "+format, args...)
}

func checkID(id string) error {
	if id == "" || len(id) > maxRequestID {
		return invalid("request_id must have 1 to %d bytes, has %d", maxRequestID, len(id))
	}
	return nil
}

// Reserve implements DecodeService.Reserve. Errors: DEADLINE_EXCEEDED or
// CANCELED when the caller gave up before the worker took the call,
// INVALID_ARGUMENT (empty id, tokens outside [1, the model's maximum
// sequence length]), ALREADY_EXISTS when the id holds a reservation, RESOURCE_EXHAUSTED when
// the pool lacks the blocks or the caller (grpcauth.Caller of ctx) would
// hold more than its caps, UNAVAILABLE while draining.
func (s *Server) Reserve(ctx context.Context, req *pdservev1.ReserveRequest) (*pdservev1.ReserveResponse, error) {
	if err := checkID(req.GetRequestId()); err != nil {
		return nil, err
	}
	tokens := int(req.GetTokens())
	if tokens <= 0 || tokens > s.spec.MaxSeqLen {
		return nil, invalid("request %s: tokens %d outside [1, %d]", req.GetRequestId(), tokens, s.spec.MaxSeqLen)
	}
	if req.GetSequences() < 0 || req.GetPromptTokens() < 0 {
		return nil, invalid("request %s: sequences %d and prompt_tokens %d must not be negative", req.GetRequestId(), req.GetSequences(), req.GetPromptTokens())
	}
	if n := int(req.GetSequences()); n > 1 {
		prompt := int(req.GetPromptTokens())
		if n > s.o.MaxBatch || prompt <= 0 || prompt >= tokens {
			return nil, invalid("request %s: %d sequences (at most %d) of %d tokens need prompt_tokens in [1, %d), got %d", req.GetRequestId(), n, s.o.MaxBatch, tokens, tokens, prompt)
		}
		tokens = needTokens(prompt, tokens-prompt, n)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		// The caller gave up (a worker that was stopped, or slow to take
		// the call, sees it late): a reservation now would wait for a
		// Generate that never comes until its TTL.
		return nil, status.FromContextError(err).Err()
	}
	if s.stopped || s.sig.DrainingLocked() {
		return nil, status.Error(codes.Unavailable, "decode: worker is draining")
	}
	if s.seqs[req.GetRequestId()] != nil {
		return nil, status.Errorf(codes.AlreadyExists, "decode: request %s already holds a reservation", req.GetRequestId())
	}
	q, err := s.reserveLocked(req.GetRequestId(), tokens, grpcauth.Caller(ctx))
	if err != nil {
		return nil, err
	}
	s.armLocked(q)
	if p := req.GetPrompt(); s.cache != nil && len(p) > 0 {
		// Pinned until the KV is imported or the request ends, so the
		// prefill worker may skip it.
		q.hit = s.cache.Acquire(s.cache.Hashes(kv.Hash(req.GetPrefixRoot()), p), s.cache.MaxHitBlocks(len(p)))
	}
	// Kept for the Generate call, which may then omit it (validated
	// there, like a prompt it carries).
	q.reservation.resPrompt = slices.Clone(req.GetPrompt())
	s.rx.expect(q)
	return &pdservev1.ReserveResponse{Blocks: int32(len(q.blocks)), BlocksFree: int32(s.freeBlocksLocked()), PrefixHitTokens: int32(q.hit.Tokens),
		PromptHeld: len(q.reservation.resPrompt) > 0}, nil
}

// needTokens is the KV a request of n choices holds: the prompt once (the
// choices share it) and max output tokens per choice.
func needTokens(prompt, maxTokens, n int) int { return prompt + max(n, 1)*maxTokens }

// reserveLocked allocates blocks for tokens and registers a sequence of
// caller, charging them to the caller.
func (s *Server) reserveLocked(id string, tokens int, caller string) (*sequence, error) {
	n := s.pool.BlocksFor(tokens)
	if err := s.checkCapsLocked(caller, id, 1, n); err != nil {
		return nil, err
	}
	blocks, err := s.allocateLocked(n)
	if err != nil {
		if errors.Is(err, kv.ErrPoolExhausted) {
			return nil, status.Errorf(codes.ResourceExhausted, "decode: reserve %d tokens for %s: %v", tokens, id, err)
		}
		return nil, status.Errorf(codes.Internal, "decode: reserve %d tokens for %s: %v", tokens, id, err)
	}
	q := &sequence{reservation: reservation{id: id, blocks: blocks, resTokens: n * s.pool.BlockTokens(), caller: caller}}
	s.chargeLocked(caller, 1, len(blocks))
	s.seqs[id] = q
	return q, nil
}

// allocateLocked allocates n pool blocks, reclaiming unpinned prefix
// cache entries, least recently used first, when the free blocks fall
// short. The reclaimed entries' engine sequences go to the runner
// (handReclaimed). Errors: kv.ErrPoolExhausted when even the reclaimable
// blocks fall short. The caller holds mu.
func (s *Server) allocateLocked(n int) ([]kv.BlockID, error) {
	if short := n - s.pool.Free(); short > 0 && s.cache != nil && short <= s.freeBlocksLocked()-s.pool.Free() {
		s.handReclaimed(s.cache.Reclaim(short * s.pool.BlockTokens()))
		s.chargeCacheLocked()
	}
	return s.pool.Allocate(n)
}

// freeBlocksLocked returns the pool's free blocks plus those of unpinned
// prefix cache entries (whole blocks: entries hold whole prompt blocks).
// The caller holds mu.
func (s *Server) freeBlocksLocked() int {
	return s.pool.Free() + s.cache.Reclaimable()/s.pool.BlockTokens()
}

// chargeCacheLocked makes the pool blocks charged to the prefix cache
// (s.cacheBlocks) BlocksFor its tokens: it releases the surplus after
// evictions, and takes more after an Insert, reclaiming older entries
// (handed to the runner) when the pool lacks them. The caller holds mu.
func (s *Server) chargeCacheLocked() {
	want := s.pool.BlocksFor(s.cache.Tokens())
	if n := len(s.cacheBlocks); want < n {
		if err := s.pool.Release(s.cacheBlocks[want:]); err != nil {
			s.log.Error("release prefix cache blocks", zap.Error(err))
		}
		s.cacheBlocks = s.cacheBlocks[:want]
		return
	}
	for want > len(s.cacheBlocks) {
		more, err := s.pool.Allocate(want - len(s.cacheBlocks))
		if err == nil {
			s.cacheBlocks = append(s.cacheBlocks, more...)
			return
		}
		// The pool is short of what the cache holds (an Insert while
		// requests hold the rest): give back the oldest entries.
		x := s.cache.Reclaim((want - len(s.cacheBlocks) - s.pool.Free()) * s.pool.BlockTokens())
		if len(x) == 0 {
			s.log.Error("prefix cache holds more KV than the pool has free, and every entry is pinned", zap.Int("blocks", want), zap.Int("charged", len(s.cacheBlocks)))
			return
		}
		s.handReclaimed(x)
		want = s.pool.BlocksFor(s.cache.Tokens())
	}
}

// handReclaimed hands the engine sequences of reclaimed prefix cache
// entries to the runner, which frees them before its next step's imports
// (freeReclaimed). The caller holds mu.
func (s *Server) handReclaimed(x []engine.SeqID) {
	if len(x) == 0 {
		return
	}
	s.rn.mu.Lock()
	s.rn.reclaimed = append(s.rn.reclaimed, x...)
	s.rn.mu.Unlock()
	s.sig.Wake()
}

// freeReclaimed frees the engine sequences of reclaimed prefix cache
// entries. The caller holds the engine lock (the scheduler, before importing KV).
func (pl batcher) freeReclaimed() {
	s := pl.s
	s.rn.mu.Lock()
	x := s.rn.reclaimed
	s.rn.reclaimed = nil
	s.rn.mu.Unlock()
	s.freeCachedLocked(x)
}

// checkCapsLocked fails with RESOURCE_EXHAUSTED when caller would hold
// more than Options.MaxReservationsPerCaller requests or
// Options.MaxReservedTokensPerCaller tokens with requests more requests
// and blocks more blocks (for request id). The caller holds mu.
func (s *Server) checkCapsLocked(caller, id string, requests, blocks int) error {
	u := s.callers[caller]
	if u == nil {
		u = &callerUse{}
	}
	who := caller
	if who == "" {
		who = "in-process"
	}
	if u.requests+requests > s.o.MaxReservationsPerCaller {
		return status.Errorf(codes.ResourceExhausted, "decode: request %s: caller %s holds %d requests on this worker, its cap (max-reservations-per-caller)", id, who, u.requests)
	}
	if tokens := blocks * s.pool.BlockTokens(); u.tokens+tokens > s.o.MaxReservedTokensPerCaller {
		return status.Errorf(codes.ResourceExhausted, "decode: request %s: caller %s holds %d KV tokens on this worker; %d more exceed its cap of %d (max-reserved-tokens-per-caller)", id, who, u.tokens, tokens, s.o.MaxReservedTokensPerCaller)
	}
	return nil
}

// chargeLocked adds requests and blocks (negative: releases them) to what
// caller holds. The caller holds mu.
func (s *Server) chargeLocked(caller string, requests, blocks int) {
	u := s.callers[caller]
	if u == nil {
		u = &callerUse{}
		s.callers[caller] = u
	}
	u.requests += requests
	u.tokens += blocks * s.pool.BlockTokens()
	if u.requests <= 0 && u.tokens <= 0 {
		delete(s.callers, caller)
	}
}

// armLocked starts q's reservation timer: Options.ReserveTTL for a
// Generate call to claim the reservation. The caller holds mu.
func (s *Server) armLocked(q *sequence) {
	q.ttl = s.afterFunc(s.o.ReserveTTL, func() { s.expire(q) })
}

// expire releases q's reservation when no Generate call claimed it within
// Options.ReserveTTL: the coordinator that made it is gone or gave up. A
// reservation whose KV is arriving gets another TTL, however long the
// transfer takes (a big or paced transfer is not a dead peer; the prefill
// worker's call ends the transfer when its request ends). A claimed
// reservation has no timer: its Generate call bounds it, waiting for KV as
// long as the call lasts, since a prompt may queue at the prefill worker
// for any time the coordinator accepts.
//
// An unclaimed reservation holds no engine sequence (the scheduler creates
// it when the sequence joins the batch), so expire takes no engine lock.
func (s *Server) expire(q *sequence) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case q.done || q.attached:
	case s.rx.receiving(q):
		s.armLocked(q)
	default:
		s.log.Info("reservation expired", zap.String("request_id", q.id), zap.Int("blocks", len(q.blocks)), zap.Duration("ttl", s.o.ReserveTTL))
		s.endLocked(q, "", status.Errorf(codes.DeadlineExceeded, "decode: reservation of %s expired: no Generate call within %v", q.id, s.o.ReserveTTL))
	}
}

// endLocked frees everything root q holds and ends its stream with
// reason or err: the blocks and caller charge, what the runner holds of
// it (drop: engine sequences, batch slot, its place in waiting;
// nothing when the runner ended it and handed it over), the cache pin and
// the staged KV. The caller holds mu, and the engine lock unless the
// runner holds no engine sequence of q. Idempotent.
func (s *Server) endLocked(q *sequence, reason string, err error) {
	if q.done {
		return
	}
	q.done = true
	if q.ttl != nil {
		q.ttl.Stop()
		q.ttl = nil
	}
	// The blocks go back first: a sequence kept by the prefix cache is
	// charged blocks of its own (chargeCacheLocked, below, or in handOff
	// when the runner ended q).
	if err := s.pool.Release(q.blocks); err != nil {
		s.log.Error("release kv blocks", zap.String("request_id", q.id), zap.Error(err))
	}
	s.chargeLocked(q.caller, -1, -len(q.blocks))
	q.blocks = nil
	if s.drop(q, err == nil || status.Code(err) == codes.Canceled) {
		s.chargeCacheLocked()
	}
	s.cache.Release(q.hit)
	q.hit = prefixcache.Hit{}
	s.rx.drop(q)
	if s.seqs[q.id] == q {
		delete(s.seqs, q.id)
	}
	if q.out != nil {
		if err == nil {
			q.out.stamp(StampLastToken, s.now())
		}
		q.out.finish(reason, err)
	}
	s.sig.EndedLocked()
}

// root returns the request's first choice: q's parent, or q itself.
func (q *sequence) root() *sequence {
	if q.parent != nil {
		return q.parent
	}
	return q
}

// over reports whether choice q produces no more tokens: it finished, or
// its request ended. The caller holds rn.mu.
func (q *sequence) over() bool { return q.choiceDone || q.root().dropped }

// holdsEngine reports whether q or one of its choices holds an engine
// sequence. The caller holds rn.mu.
func (q *sequence) holdsEngine() bool {
	if q.hasSeq {
		return true
	}
	for _, c := range q.children {
		if c.hasSeq {
			return true
		}
	}
	return false
}

// end is endLocked for callers holding no lock, for root q. It takes the
// engine lock only when the runner holds an engine sequence of q, or
// ended q and is handing it over (then it waits for the step in progress,
// and finds q ended by the runner): a request that is reserved, waits for
// or receives its KV, or waits to join ends at once.
func (s *Server) end(q *sequence, err error) {
	s.mu.Lock()
	if q.done {
		s.mu.Unlock()
		return
	}
	if s.dropIdle(q) {
		// The runner dropped q in the critical section that saw it hold no
		// engine sequence: it will not start it.
		s.endLocked(q, "", err)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.run.LockEngine()
	defer s.run.UnlockEngine()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endLocked(q, "", err)
}

// Cancel implements DecodeService.Cancel: it ends the request, frees its
// engine sequence, blocks and reservation, and ends its Generate call with
// CANCELED. Unknown ids are not an error.
func (s *Server) Cancel(_ context.Context, req *pdservev1.CancelRequest) (*pdservev1.CancelResponse, error) {
	if err := checkID(req.GetRequestId()); err != nil {
		return nil, err
	}
	s.CancelRequest(req.GetRequestId())
	return &pdservev1.CancelResponse{}, nil
}

// CancelRequest ends request id as Cancel does and reports whether it
// existed.
func (s *Server) CancelRequest(id string) bool {
	s.mu.Lock()
	q := s.seqs[id]
	s.mu.Unlock()
	if q == nil {
		return false
	}
	s.end(q, status.Errorf(codes.Canceled, "decode: request %s cancelled", id))
	return true
}

// genParams are a validated GenerateRequest.
type genParams struct {
	id         string
	prompt     []int32
	sampling   engine.Sampling
	maxTokens  int
	local      bool
	ignoreEOS  bool
	generated  []int32
	stop       map[int32]bool
	n          int
	genChoices [][]int32
	constraint engine.GrammarState // the grammar advanced over generated, or nil; attach takes it
	// forkStates are choices 1..n-1's grammar states (nil: no grammar);
	// attach takes them.
	forkStates []engine.GrammarState
	top        int
	promptTop  int
	caller     string    // grpcauth.Caller of the call
	hashes     []kv.Hash // the prompt's full blocks, for the prefix cache
	// omitFirst: the caller delivers choice 0's first token from the
	// prefill worker (first_token_from_prefill); it is not streamed.
	omitFirst bool
	// peer is a worker holding a longer prefix of a local prompt
	// (GenerateRequest.peer; nil: none, or not a local prefill); pull:
	// the call pulls it before the sequence is ready (attach holds it,
	// pulling).
	peer *pdservev1.PeerPrefix
	pull bool
	// disk is a local prompt's prefix read from the disk tier (nil:
	// none; see sequence.disk).
	disk *prefixcache.DiskRead
}

func (s *Server) validate(req *pdservev1.GenerateRequest) (genParams, error) {
	id := req.GetRequestId()
	if err := checkID(id); err != nil {
		return genParams{}, err
	}
	p := genParams{
		id:        id,
		prompt:    slices.Clone(req.GetPromptTokens()),
		maxTokens: int(req.GetMaxTokens()),
		local:     req.GetLocalPrefill(),
		ignoreEOS: req.GetIgnoreEos(),
		generated: slices.Clone(req.GetGeneratedTokens()),
	}
	if len(p.prompt) == 0 {
		return p, invalid("request %s: prompt_tokens is empty", id)
	}
	if p.maxTokens <= 0 {
		return p, invalid("request %s: max_tokens %d must be positive", id, p.maxTokens)
	}
	if len(p.prompt)+p.maxTokens > s.spec.MaxSeqLen {
		return p, invalid("request %s: prompt %d + max_tokens %d exceed the model's maximum of %d tokens", id, len(p.prompt), p.maxTokens, s.spec.MaxSeqLen)
	}
	p.n = max(1, int(req.GetN()))
	if p.n > s.o.MaxBatch {
		return p, invalid("request %s: n %d is over the batch of %d sequences", id, p.n, s.o.MaxBatch)
	}
	if _, ok := s.eng.(engine.Forker); p.n > 1 && !ok {
		return p, status.Errorf(codes.Unimplemented, "decode: request %s: n %d needs an engine that forks sequences", id, p.n)
	}
	gc := req.GetGeneratedChoices()
	if len(gc) > 0 && len(gc) != p.n-1 {
		return p, invalid("request %s: %d generated_choices for n %d (want n-1)", id, len(gc), p.n)
	}
	for _, g := range gc {
		p.genChoices = append(p.genChoices, slices.Clone(g.GetTokens()))
	}
	for i, g := range append([][]int32{p.generated}, p.genChoices...) {
		if len(g) >= p.maxTokens {
			return p, invalid("request %s: %d generated tokens of choice %d leave nothing to generate under max_tokens %d", id, len(g), i, p.maxTokens)
		}
		if err := checkTokens(s.spec, id, "generated tokens", g); err != nil {
			return p, err
		}
	}
	var err error
	if p.top, err = wire.FromLogprobs(req.GetLogprobs()); err != nil {
		return p, invalid("request %s: logprobs: %v", id, err)
	}
	if p.promptTop, err = wire.FromLogprobs(req.GetPromptLogprobs()); err != nil {
		return p, invalid("request %s: prompt_logprobs: %v", id, err)
	}
	if p.promptTop >= 0 && (!p.local || len(p.generated) > 0) {
		return p, invalid("request %s: prompt_logprobs need local_prefill and no generated tokens", id)
	}
	if p.local && p.promptTop < 0 {
		// Prompt logprobs need every prompt position computed.
		p.peer = req.GetPeer()
	}
	if req.GetFirstTokenFromPrefill() && p.local {
		return p, invalid("request %s: first_token_from_prefill needs remote KV, not local_prefill", id)
	}
	// A recovery streams only tokens after generated_tokens: nothing to omit.
	p.omitFirst = req.GetFirstTokenFromPrefill() && len(p.generated) == 0
	if err := checkTokens(s.spec, id, "prompt_tokens", p.prompt); err != nil {
		return p, err
	}
	if err := checkTokens(s.spec, id, "stop_tokens", req.GetStopTokens()); err != nil {
		return p, err
	}
	if len(req.GetStopTokens()) > 0 {
		p.stop = make(map[int32]bool, len(req.GetStopTokens()))
		for _, t := range req.GetStopTokens() {
			p.stop[t] = true
		}
	}
	if p.sampling, err = wire.FromSampling(req.GetSampling()); err != nil {
		return p, invalid("request %s: %v", id, err)
	}
	if err := s.constrain(&p, req.GetPrefixRoot()); err != nil {
		return p, err
	}
	p.hashes = s.cache.Hashes(kv.Hash(req.GetPrefixRoot()), p.prompt)
	return p, nil
}

// constrain compiles p's grammar once and builds every choice's state
// from it, advanced over the tokens the choice holds (prefill's first
// token, or those generated before a failover): here, in the call's
// goroutine, never on the engine loop, which only takes the states.
// Nothing when p has no grammar. Errors: INVALID_ARGUMENT naming the
// grammar's fault (a limit, its syntax, a refused generated token). The
// states' later work runs on s.offload under the request's tenant (root,
// its prefix_root).
func (s *Server) constrain(p *genParams, root uint64) error {
	if p.sampling.Grammar == "" {
		return nil
	}
	c, err := s.grammars.Compile(p.sampling.Grammar)
	if err != nil {
		return invalid("request %s: %v", p.id, err)
	}
	if p.constraint, err = c.Offloaded(s.offload, root, p.generated); err != nil {
		return invalid("request %s: %v", p.id, err)
	}
	for i := 1; i < p.n; i++ {
		var gen []int32
		if len(p.genChoices) > 0 {
			gen = p.genChoices[i-1]
		}
		st, err := c.Offloaded(s.offload, root, gen)
		if err != nil {
			p.closeGrammars()
			return invalid("request %s: choice %d: %v", p.id, i, err)
		}
		p.forkStates = append(p.forkStates, st)
	}
	return nil
}

// closeGrammars closes the grammar states p holds (when attach did not
// take them).
func (p *genParams) closeGrammars() {
	closeGrammar(p.constraint)
	for _, st := range p.forkStates {
		closeGrammar(st)
	}
	p.constraint, p.forkStates = nil, nil
}

// checkTokens reports a token of toks outside the vocabulary.
func checkTokens(spec engine.ModelSpec, id, what string, toks []int32) error {
	for i, t := range toks {
		if t < 0 || int(t) >= spec.Vocab {
			return invalid("request %s: %s[%d] = %d outside the vocabulary [0, %d)", id, what, i, t, spec.Vocab)
		}
	}
	return nil
}

// Generate implements DecodeService.Generate; see the package doc for the
// events. Errors: INVALID_ARGUMENT for a bad request or one that does not
// match the KV received, ALREADY_EXISTS when another call claimed the id,
// RESOURCE_EXHAUSTED when no reservation exists and the pool lacks the
// blocks or the caller is at its caps (see Reserve), FAILED_PRECONDITION for local_prefill after KV was sent,
// ABORTED when the KV transfer failed, CANCELED after Cancel, UNAVAILABLE
// when the worker drains (without a reservation) or stops.
func (s *Server) Generate(req *pdservev1.GenerateRequest, stream grpc.ServerStreamingServer[pdservev1.GenerateResponse]) error {
	ctx := stream.Context()
	var stamps map[string]int64 // the first of each stamp sent, when the call is traced
	if tracing.Recording(ctx) {
		stamps = map[string]int64{"call": s.now().UnixNano()}
		defer func() { traceSteps(ctx, stamps) }()
	}
	if len(req.GetPromptTokens()) == 0 {
		if prompt := s.reservedPrompt(req.GetRequestId()); prompt != nil {
			// The reservation holds the prompt (ReserveResponse.prompt_held).
			req = proto.CloneOf(req)
			req.PromptTokens = prompt
		}
	}
	p, err := s.validate(req)
	if err != nil {
		return err
	}
	p.caller = grpcauth.Caller(ctx)
	plan := s.planPull(p)
	p.pull = plan != nil
	if p.local && p.promptTop < 0 {
		// A file the disk tier holds is read here, not under the engine
		// lock where the prefix is imported.
		p.disk = s.cache.ReadDisk(ctx, p.hashes, s.cache.MaxHitBlocks(len(p.prompt)))
	}
	q, err := s.attach(p)
	if err != nil {
		p.closeGrammars()
		return err
	}
	if plan != nil {
		// The sequence waits, holding its reservation, until the pull
		// ended: network I/O under no lock of the worker.
		s.pullDone(q, s.pullPrefix(ctx, p.id, plan))
	}
	for {
		select {
		case <-q.out.notify:
			resps, final, ferr := q.out.take()
			for _, resp := range resps {
				if stamps != nil {
					for _, st := range resp.GetStamps() {
						if _, ok := stamps[st.GetName()]; !ok {
							stamps[st.GetName()] = st.GetUnixNano()
						}
					}
				}
				if err := s.send(stream, q, resp); err != nil {
					s.end(q, status.Errorf(codes.Canceled, "decode: send to coordinator: %v", err))
					return err
				}
			}
			if final {
				return ferr
			}
		case <-ctx.Done():
			err := status.FromContextError(context.Cause(ctx)).Err()
			s.end(q, err)
			return err
		}
	}
}

// reservedPrompt returns the prompt the reservation of request id was
// shown (the caller's), or nil.
func (s *Server) reservedPrompt(id string) []int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.seqs[id]; q != nil {
		return slices.Clone(q.reservation.resPrompt)
	}
	return nil
}

// traceSteps records the worker's steps of a traced Generate call from
// the stamps it sent: the KV received, a local prefill, the wait to join
// the batch, and the generation.
func traceSteps(ctx context.Context, stamps map[string]int64) {
	tracing.Step(ctx, tracing.SpanKVReceive, stamps[StampKVFirstByte], stamps[StampKVDone])
	tracing.Step(ctx, tracing.SpanPrefillCompute, stamps[StampPrefillStart], stamps[StampPrefillEnd])
	tracing.Step(ctx, tracing.SpanDecodeWait, stamps["call"], stamps[StampJoined])
	tracing.Step(ctx, tracing.SpanDecodeGenerate, stamps[StampJoined], stamps[StampLastToken])
}

// Reasons a request of a caller that does not read is cancelled, as
// pdserve_decode_stream_stalled_cancels_total labels them.
const (
	reasonOutbox       = "outbox"        // its output outgrew Options.MaxOutboxBytes
	reasonWriteTimeout = "write_timeout" // a send blocked for Options.StreamWriteTimeout
)

// send sends resp on q's stream. A send that blocks for longer than
// Options.StreamWriteTimeout cancels q (stalled); the send itself goes on
// until the caller reads or goes away.
func (s *Server) send(stream grpc.ServerStreamingServer[pdservev1.GenerateResponse], q *sequence, resp *pdservev1.GenerateResponse) error {
	if s.o.StreamWriteTimeout <= 0 {
		return stream.Send(resp)
	}
	wd := time.AfterFunc(s.o.StreamWriteTimeout, func() {
		s.stalled(q, reasonWriteTimeout, status.Errorf(codes.DeadlineExceeded,
			"decode: request %s: its caller did not read for %v", q.id, s.o.StreamWriteTimeout))
	})
	defer wd.Stop()
	return stream.Send(resp)
}

// stalled cancels root request q, whose caller does not read, with err:
// it ends q (end), then drops, counts and logs its waiting output
// (countStalled). The caller holds no lock; the runner cancels such a
// request itself (emitLocked, then handOff).
func (s *Server) stalled(q *sequence, reason string, err error) {
	s.mu.Lock()
	first := !q.done
	s.mu.Unlock()
	if !first {
		return // it ended meanwhile
	}
	s.end(q, err)
	s.countStalled(q, reason)
}

// countStalled drops the output waiting in the outbox of root q, whose
// caller does not read and which ended, and counts and logs it.
func (s *Server) countStalled(q *sequence, reason string) {
	pending := q.out.pending()
	q.out.drop()
	s.m.stalled(reason)
	s.log.Warn("caller stopped reading: request cancelled", zap.String("request_id", q.id), zap.String("reason", reason),
		zap.String("caller", q.caller), zap.Int("pending_bytes", pending))
}

// attach binds a Generate call to its reservation (or a new one) and queues
// it when it is ready to join the batch.
func (s *Server) attach(p genParams) (*sequence, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, errStopped
	}
	need := needTokens(len(p.prompt), p.maxTokens, p.n)
	q := s.seqs[p.id]
	switch {
	case q == nil && s.sig.DrainingLocked():
		return nil, status.Error(codes.Unavailable, "decode: worker is draining")
	case q == nil:
		var err error
		if q, err = s.reserveLocked(p.id, need, p.caller); err != nil {
			return nil, err
		}
	case q.attached:
		return nil, status.Errorf(codes.AlreadyExists, "decode: request %s already has a Generate call", p.id)
	}
	if q.resTokens < need {
		// Grow a reservation made for fewer tokens, charged to whoever
		// made it.
		grow := s.pool.BlocksFor(need) - len(q.blocks)
		if err := s.checkCapsLocked(q.caller, p.id, 0, grow); err != nil {
			return nil, err
		}
		more, err := s.allocateLocked(grow)
		if err != nil {
			return nil, status.Errorf(codes.ResourceExhausted, "decode: request %s reserved %d tokens, needs %d: %v", p.id, q.resTokens, need, err)
		}
		s.chargeLocked(q.caller, 0, len(more))
		q.blocks = append(q.blocks, more...)
		q.resTokens = len(q.blocks) * s.pool.BlockTokens()
	}
	// The claim is handed to the receiver in the critical section that
	// checks the transfer against the call, so a transfer that aborts
	// meanwhile either is seen here or sees the claim (and ends q).
	if err := s.claimKVLocked(q, p); err != nil {
		return nil, err
	}
	if q.ttl != nil {
		// Claimed: from now on the call bounds the request, also while it
		// waits for remote KV (see expire).
		q.ttl.Stop()
		q.ttl = nil
	}
	if q.hit.Tokens > 0 && p.local {
		// Local prefill looks the cache up itself when it joins.
		s.cache.Release(q.hit)
		q.hit = prefixcache.Hit{}
	}
	q.hashes = p.hashes
	q.disk = p.disk
	q.attached = true
	q.local = p.local
	q.prompt = p.prompt
	q.sampling = p.sampling
	q.maxTokens = p.maxTokens
	q.ignoreEOS = p.ignoreEOS
	q.stop = p.stop
	q.generated = p.generated
	q.n, q.genChoices, q.top, q.promptTop = p.n, p.genChoices, p.top, p.promptTop
	q.penalties = newPenalties(q.sampling.Penalties, q.generated)
	q.sampling.Penalties = q.penalties
	q.constraint, q.forkStates = p.constraint, p.forkStates
	if q.constraint != nil {
		q.sampling.Constraint = q.constraint
	}
	q.out = newOutbox(p.n, s.o.MaxOutboxBytes)
	if p.omitFirst {
		q.out.omitFirst()
	}
	q.pulling = p.pull
	s.readyLocked(q)
	return q, nil
}

// claimKVLocked hands Generate call p's claim of q to the KV receiver,
// in one critical section of rx.mu with the checks of the call against
// the transfer: FAILED_PRECONDITION for local prefill when KV was sent or
// is arriving, INVALID_ARGUMENT when the KV received does not cover the
// prompt or the prompt differs from the one reserved (its cached prefix,
// or the prompt Reserve was shown), ABORTED (ending q)
// when the transfer failed. It also hands over the reservation's size,
// which attach may have grown. The caller holds mu.
func (s *Server) claimKVLocked(q *sequence, p genParams) error {
	s.rx.mu.Lock()
	s.rx.register(q)
	q.limit = q.resTokens
	var err error
	switch {
	case p.local && (q.sink != nil || q.committed):
		err = status.Errorf(codes.FailedPrecondition, "decode: request %s asks for local prefill but its kv was sent", p.id)
	case !p.local && q.committed && q.kvTokens != len(p.prompt):
		err = invalid("request %s: prompt has %d tokens, the kv received covers %d", p.id, len(p.prompt), q.kvTokens)
	case !p.local && q.xferErr != nil:
		err = status.Errorf(codes.Aborted, "decode: kv transfer of %s failed: %v", p.id, q.xferErr)
		s.rx.mu.Unlock()
		// The failed transfer freed the engine sequence (hasSeq is
		// false), so ending q needs no engine lock.
		s.endLocked(q, "", err)
		return err
	case !p.local && q.hit.Tokens > 0 && (len(p.hashes) < len(q.hit.Hashes) || !slices.Equal(p.hashes[:len(q.hit.Hashes)], q.hit.Hashes)):
		err = invalid("request %s: the prompt differs from the one reserved (its cached prefix of %d tokens)", p.id, q.hit.Tokens)
	case q.reservation.resPrompt != nil && !slices.Equal(p.prompt, q.reservation.resPrompt):
		err = invalid("request %s: the prompt (%d tokens) differs from the one reserved (%d tokens)", p.id, len(p.prompt), len(q.reservation.resPrompt))
	default:
		q.claimed, q.claimLocal, q.claimPrompt = true, p.local, len(p.prompt)
	}
	s.rx.mu.Unlock()
	return err
}

// closeGrammar closes c when it is not nil.
func closeGrammar(c engine.GrammarState) {
	if c != nil {
		c.Close()
	}
}

// newPenalties returns penalty counts with the weights of w (nil: none)
// holding generated.
func newPenalties(w *engine.Penalties, generated []int32) *engine.Penalties {
	if w == nil {
		return nil
	}
	p := &engine.Penalties{Presence: w.Presence, Frequency: w.Frequency}
	p.Add(generated...)
	return p
}

// readyLocked hands q to the runner, which queues it to join the batch,
// once it has its Generate call and its KV (or prefills locally); the
// cache pin of Reserve goes with it. The caller holds mu, not rn.mu nor
// rx.mu.
func (s *Server) readyLocked(q *sequence) {
	if q.done || !q.attached || q.pulling || (!q.local && !s.rx.committed(q)) {
		return
	}
	s.rn.mu.Lock()
	defer s.rn.mu.Unlock()
	if q.queued || q.joined || q.dropped {
		return
	}
	q.queued = true
	q.pin, q.hit = q.hit, prefixcache.Hit{}
	s.rn.waiting = append(s.rn.waiting, q)
	s.sig.Wake()
}

// MaxBatch returns the most sequences one step runs (Options.MaxBatch):
// the most choices a request may ask.
func (s *Server) MaxBatch() int { return s.o.MaxBatch }

// BlockTokens returns the tokens of one KV block of the pool, the block
// of the prefix hashes too.
func (s *Server) BlockTokens() int { return s.o.BlockTokens }
