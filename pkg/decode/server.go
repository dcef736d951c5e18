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
	"github.com/pdserve/pdserve/pkg/decode/batch"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/grammar"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/peerpull"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/tracing"
	"github.com/pdserve/pdserve/pkg/wire"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// Finish reasons of the last GenerateResponse.
const (
	FinishLength = batch.FinishLength // max_tokens reached
	FinishStop   = batch.FinishStop   // an end-of-generation token (unless ignore_eos) or a stop token
)

// Stamps of GenerateResponse events.
const (
	StampKVFirstByte  = batch.StampKVFirstByte
	StampKVDone       = batch.StampKVDone
	StampPrefillStart = batch.StampPrefillStart
	StampPrefillEnd   = batch.StampPrefillEnd
	StampJoined       = batch.StampJoined
	StampFirstToken   = batch.StampFirstToken
	StampLastToken    = vocab.StampLastToken
)

// errStopped fails requests still live when the batch stops.
var errStopped = status.Error(codes.Unavailable, "decode: worker stopping")

// Server is a decode (or colocated) worker. Create it with New, register it
// on a gRPC server with Register (DecodeService and the KV transfer
// receiver), and run the batch with Run.
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

	// sig wakes the batch, and holds draining and the end of each
	// request (its ...Locked methods under mu).
	sig *batching.Signals
	// moveOut: MigrateAll drains the worker; each request handed to the
	// batch from then on moves out too once it can (under mu; cleared by
	// SetDraining(false)).
	moveOut bool
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
	// entries in the service (Reserve) or the batch (local join); forks,
	// inserts and frees of its sequences are the batch's. Its tokens
	// share the pool with requests, and the pool charge is the service's,
	// guarded by mu: cacheBlocks are the pool blocks charged to them now
	// (BlocksFor the cache's tokens, see chargeCacheLocked), settled by the
	// service after the batch inserted entries (ended), and a request
	// short of blocks reclaims unpinned entries (allocateLocked), whose
	// engine sequences it hands to the batch (batch.Reclaimed).
	cache       *prefixcache.Cache
	cacheBlocks []kv.BlockID
	// peers prices a local prefill's pull of its prefix from a peer
	// worker (GenerateRequest.peer); dialer pulls it (nil: no pulls, see
	// WithDialer).
	peers  *kvtransfer.PullPricer
	dialer *kvtransfer.Dialer
	// trust holds the peers whose pulled KV failed a spot check: no
	// longer pulled from (its own lock, a leaf).
	trust peerpull.Trust

	// b is the batch: continuous batching over the engine, run by its
	// own goroutine (Run), which owns every sequence and the engine's
	// memory. The service and the KV receiver hand it messages (Post:
	// Join, Arrived, Cancel, Reclaimed) and hear back through each
	// call's outbox and ended.
	b *batch.Batch

	// offload computes the grammar states of the batch's choices off the
	// engine loop (batch.Config.Grammars).
	offload *grammar.Offload

	// rx is the KV receiver's state, under its own lock.
	rx rxState

	// mu is the service's: it guards the reservations and calls, the
	// per-caller caps and the pool's charge to the prefix cache. It is
	// never held across a call into the KV receiver nor the batch (which
	// only Post reaches, a leaf), nor waited for by the batch's loop but
	// in ended. Its holders release it with unlock, which then hands the
	// requests that ended under it (ends) to the receiver.
	mu      sync.Mutex
	ends    []ended
	seqs    map[string]*sequence // every reserved or live request, by id
	holds   map[string]*migHold  // migrated sequences' KV, until pulled (migrate.go)
	stopped bool
	keys    uint64                // the last sequence.key given
	callers map[string]*callerUse // what each caller's requests hold (see Options.MaxReservationsPerCaller)
}

// ended is a request that ended in the service, for unlock to hand to
// the KV receiver; cancel: it was never handed to the batch, which may
// hold KV that arrived for it.
type ended struct {
	q      *sequence
	cancel bool
}

// unlock releases mu, then hands each request that ended while it was
// held to the KV receiver (rxState.drop: no transfer may begin or go on
// for it) and, when it was never handed to the batch, posts a Cancel
// that frees KV that arrived there for it: in that order, so that a
// transfer committed before the drop posted its KV (under rx.mu) before
// the Cancel. Every holder of mu releases it with unlock.
func (s *Server) unlock() {
	es := s.ends
	s.ends = nil
	s.mu.Unlock()
	for _, e := range es {
		s.rx.drop(e.q)
		if e.cancel {
			s.b.Post(batch.Cancel(e.q.key, nil, false))
		}
	}
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

// sequence is one request on this worker as the service and the KV
// receiver see it, from Reserve (or Generate) to its end. The service
// writes reservation, done, pulling, handed and the call's fields under
// Server.mu; the KV receiver writes kvIn under Server.rx.mu. What the
// request is in the batch (its engine sequences, choices, progress) is the
// batch's alone, handed over in the Join.
type sequence struct {
	reservation
	kvIn
	// key names the request in the batch's messages: unique for the
	// worker's life.
	key  uint64
	done bool
	// attached: a Generate call claimed the request; out is its outbox,
	// shared with the batch from the Join on.
	attached bool
	out      *outbox
	// join is the request for the batch, built at attach, until it is
	// handed over (handed: the batch owns it and reports its end; the
	// service ends it only through a Cancel message then).
	join   *batch.Request
	handed bool
	// cancelling: a Cancel was posted for the handed request. stalled:
	// it was cancelled because its caller does not read (counted).
	cancelling, stalled bool
	// pulling: a local prefill's Generate call is pulling the prompt's
	// prefix from a peer; it is handed to the batch only once the pull
	// ended (pullDone).
	pulling bool
}

// reservation is what the service holds for a request from Reserve (or a
// Generate without one) to its end: pool blocks charged to its caller,
// the reservation timer, and the prefix cache pin of Reserve (until the
// request is handed to the batch, in its Join).
type reservation struct {
	id        string
	blocks    []kv.BlockID
	resTokens int    // tokens the blocks hold
	ttl       timer  // releases an unclaimed reservation; nil once claimed
	caller    string // who made the request (grpcauth.Caller); charged with its blocks
	// hit is the cached prefix pinned at Reserve for the remote KV
	// (Tokens 0: none), handed to the batch in the Join, or released
	// when the request ends before.
	hit prefixcache.Hit
	// resPrompt is the prompt Reserve was shown (ReserveRequest.prompt),
	// or nil: a Generate call that omits its prompt takes this one.
	resPrompt []int32
}

// kvIn is the KV transfer of a remote prefill, written by the KV
// receiver (Begin, Commit, Abort, the first Write). Guarded by
// Server.rx.mu. The service writes what a transfer may be (limit,
// hitTokens, the claim) and ended through the hand-offs of rxState. The
// committed KV itself goes to the batch (Arrived).
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

	sink *sink // the open transfer, or nil
	// held is the KV of a committed transfer until a Generate call
	// claims the request (it goes to the batch in the Join), or nil. A
	// transfer committed after the claim goes to the batch at once
	// (Arrived).
	held      *batch.KV
	xferErr   error // why the last transfer failed, until another begins
	committed bool
	kvTokens  int
	firstByte time.Time
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
// receives the worker's metrics (nil: none are exported). The batch does
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
		holds:      make(map[string]*migHold),
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
	memTokens, memSeqs := engineMemory(eng)
	s.offload = grammar.NewOffload(grammarWorkers(), s.sig.Wake)
	s.b = batch.New(batch.Config{
		Grammars:       s.offload,
		Engine:         eng,
		Cache:          s.cache,
		EOG:            eog,
		MaxBatch:       o.MaxBatch,
		MaxBatchTokens: o.MaxBatchTokens,
		ChunkTokens:    o.ChunkTokens,
		CacheMaxTokens: s.o.PrefixCache.MaxTokens,
		TokenBytes:     tokenBytes,
		MemTokens:      memTokens,
		MemSeqs:        memSeqs,
		Overtakes:      batching.DefaultOvertakes,
		Signals:        s.sig,
		Stopped:        ctx,
		Observe:        s.m.observeStep,
		ObservePrefill: s.peers.ObserveStep,
		Report:         s.ended,
		Stop:           s.stopping,
		Log:            logger,
		Now:            func() time.Time { return s.now() },
	})
	return s, nil
}

// Register registers DecodeService and the KV transfer receiver on g (which
// also serves peers' pulls of its cached prefixes), with the transfer
// server options opts. The receiver takes KV of the engine's
// KV dtype only.
func (s *Server) Register(g grpc.ServiceRegistrar, opts ...kvtransfer.ServerOption) {
	pdservev1.RegisterDecodeServiceServer(g, s)
	kvtransfer.Register(g, receiver{s}, s.spec.KVDType, append(opts, kvtransfer.WithPullSource(s), kvtransfer.WithSequenceSource(s))...)
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
	st := s.stats()
	st.KVTransfers = s.rx.transfers()
	return st
}

// stats is Stats but for the receiver's part.
func (s *Server) stats() Stats {
	s.mu.Lock()
	defer s.unlock()
	times, last := s.b.Steps()
	ld := s.b.Load()
	st := Stats{
		KVBlocksFree:        s.freeBlocksLocked(),
		KVBlocksTotal:       s.pool.Total(),
		Requests:            len(s.seqs),
		LastBatch:           last,
		StepTimesMs:         times,
		StagedKVBytes:       s.stagedBytes.Load(),
		Draining:            s.sig.DrainingLocked(),
		PrefixCache:         s.cache.Stats(),
		KVBytesSaved:        s.kvSaved.Load(),
		Running:             ld.Running,
		Waiting:             ld.Waiting,
		QueuedPrefillTokens: ld.QueuedPrefillTokens,
	}
	return st
}

// SetDraining marks the worker draining: Reserve, and Generate without a
// reservation, fail with UNAVAILABLE; reserved and live requests finish.
func (s *Server) SetDraining(d bool) {
	s.mu.Lock()
	s.sig.SetDrainingLocked(d)
	s.moveOut = s.moveOut && d
	s.unlock()
}

// WaitIdle blocks until no request is reserved or live and no migrated
// sequence's KV is held for its pull (MigrateAll), or ctx ends
// (returning its error).
func (s *Server) WaitIdle(ctx context.Context) error {
	return s.sig.WaitIdle(ctx, &s.mu, func() int { return len(s.seqs) + len(s.holds) })
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "decode: "+format, args...)
}

func checkID(id string) error {
	if id == "" || len(id) > vocab.MaxRequestID {
		return invalid("request_id must have 1 to %d bytes, has %d", vocab.MaxRequestID, len(id))
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
	q, resp, err := s.reserve(ctx, req, tokens)
	if err != nil {
		return nil, err
	}
	// The receiver hears of it after mu (the transfer may begin once the
	// caller has the answer).
	s.rx.expect(q, int(resp.GetBlocks())*s.pool.BlockTokens(), int(resp.GetPrefixHitTokens()))
	return resp, nil
}

// reserve is Reserve's part under mu: request req of tokens reserved.
func (s *Server) reserve(ctx context.Context, req *pdservev1.ReserveRequest, tokens int) (*sequence, *pdservev1.ReserveResponse, error) {
	s.mu.Lock()
	defer s.unlock()
	if err := ctx.Err(); err != nil {
		// The caller gave up (a worker that was stopped, or slow to take
		// the call, sees it late): a reservation now would wait for a
		// Generate that never comes until its TTL.
		return nil, nil, status.FromContextError(err).Err()
	}
	if s.stopped || s.sig.DrainingLocked() {
		return nil, nil, status.Error(codes.Unavailable, "decode: worker is draining")
	}
	if s.seqs[req.GetRequestId()] != nil {
		return nil, nil, status.Errorf(codes.AlreadyExists, "decode: request %s already holds a reservation", req.GetRequestId())
	}
	q, err := s.reserveLocked(req.GetRequestId(), tokens, grpcauth.Caller(ctx))
	if err != nil {
		return nil, nil, err
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
	return q, &pdservev1.ReserveResponse{Blocks: int32(len(q.blocks)), BlocksFree: int32(s.freeBlocksLocked()), PrefixHitTokens: int32(q.hit.Tokens),
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
	s.keys++
	q := &sequence{key: s.keys, reservation: reservation{id: id, blocks: blocks, resTokens: n * s.pool.BlockTokens(), caller: caller}}
	s.chargeLocked(caller, 1, len(blocks))
	s.seqs[id] = q
	return q, nil
}

// allocateLocked allocates n pool blocks, reclaiming unpinned prefix
// cache entries, least recently used first, when the free blocks fall
// short. The reclaimed entries' engine sequences go to the batch
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
// (handed to the batch) when the pool lacks them. The caller holds mu.
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
// entries to the batch, which frees them before anything joins. The
// caller holds mu.
func (s *Server) handReclaimed(x []engine.SeqID) {
	if len(x) > 0 {
		s.b.Post(batch.Reclaimed(x))
	}
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
// An unclaimed reservation was never handed to the batch, so expire
// ends it in the service alone.
func (s *Server) expire(q *sequence) {
	// Asked before mu: a transfer that begins right after is ended with
	// the reservation, as if the TTL had fired a moment earlier.
	receiving := s.rx.receiving(q)
	s.mu.Lock()
	defer s.unlock()
	switch {
	case q.done || q.attached:
	case receiving:
		s.armLocked(q)
	default:
		s.log.Info("reservation expired", zap.String("request_id", q.id), zap.Int("blocks", len(q.blocks)), zap.Duration("ttl", s.o.ReserveTTL))
		s.endLocked(q, "", status.Errorf(codes.DeadlineExceeded, "decode: reservation of %s expired: no Generate call within %v", q.id, s.o.ReserveTTL))
	}
}

// endLocked frees everything q holds in the service and ends its stream
// with reason or err: the blocks and caller charge, the cache pin and
// the transfer. A request never handed to the batch also has its KV
// there (Arrived) freed. For a handed request it is called only with the
// batch's End (ended): the batch holds nothing of it any more. The
// caller holds mu. Idempotent.
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
	// charged blocks of its own (chargeCacheLocked, in ended).
	if err := s.pool.Release(q.blocks); err != nil {
		s.log.Error("release kv blocks", zap.String("request_id", q.id), zap.Error(err))
	}
	s.chargeLocked(q.caller, -1, -len(q.blocks))
	q.blocks = nil
	s.cache.Release(q.hit)
	q.hit = prefixcache.Hit{}
	if q.join != nil {
		closeGrammar(q.join.Constraint)
		for _, st := range q.join.ForkStates {
			closeGrammar(st)
		}
		q.join = nil
	}
	// The receiver hears of the end when mu is released (unlock); KV
	// may have arrived at the batch for a request never handed to it.
	s.ends = append(s.ends, ended{q: q, cancel: !q.handed})
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

// ended is the batch's report (batch.Config.Report): the requests that
// ended there, which the service ends with their reason or error, and
// whether the prefix cache's tokens changed (its pool charge is settled
// after the blocks went back). The batch holds nothing of them any more.
func (s *Server) ended(es []batch.End, cacheChanged bool) {
	s.mu.Lock()
	defer s.unlock()
	for _, e := range es {
		q := s.seqs[e.ID]
		if q == nil || q.key != e.Key || q.done {
			continue
		}
		switch e.Kind {
		case batch.Finished:
			s.endLocked(q, e.Reason, nil)
		case batch.Cancelled:
			s.endLocked(q, "", e.Err)
		case batch.Failed:
			s.endLocked(q, "", status.Error(codes.Internal, e.Err.Error()))
		case batch.Refused:
			s.endLocked(q, "", grammarRefused(q.id, e.Choice, e.Err))
		case batch.Migrated:
			s.migratedLocked(q, e.Snap)
		case batch.Stalled:
			s.endLocked(q, "", status.Errorf(codes.ResourceExhausted,
				"decode: request %s: its caller does not read: over %d bytes of output wait to be sent", q.id, s.o.MaxOutboxBytes))
			s.countStalled(q, reasonOutbox)
		default:
			s.endLocked(q, "", errStopped)
		}
	}
	if cacheChanged {
		s.chargeCacheLocked()
	}
}

// stopping is the batch's Stop hook: the worker refuses new requests,
// and ends those never handed to the batch (it reports the others).
func (s *Server) stopping() {
	s.mu.Lock()
	defer s.unlock()
	s.stopped = true
	for id := range s.holds {
		s.dropHoldLocked(id)
	}
	for _, q := range s.seqs {
		if !q.handed {
			s.endLocked(q, "", errStopped)
		}
	}
}

// grammarRefused is the error of a request whose choice's grammar allows
// no token (cause: its state's refusal of the token sampled anyway):
// FAILED_PRECONDITION marked by wire.GrammarRefusedStatus, which the
// coordinator does not take for a worker's failure, and maps to HTTP 500.
func grammarRefused(id string, choice int, cause error) error {
	return wire.GrammarRefusedStatus("decode: request %s: choice %d: the grammar allows no token here (%v)", id, choice, cause)
}

// end ends q with err, holding no lock: at once when the batch does not
// hold it; otherwise through a Cancel message, the batch reporting the
// end at its next step boundary (or its own end, had it ended q first).
func (s *Server) end(q *sequence, err error) {
	s.mu.Lock()
	defer s.unlock()
	s.endOrCancelLocked(q, err)
}

// endOrCancelLocked is end for a caller holding mu.
func (s *Server) endOrCancelLocked(q *sequence, err error) {
	switch {
	case q.done:
	case !q.handed:
		s.endLocked(q, "", err)
	case !q.cancelling:
		q.cancelling = true
		s.b.Post(batch.Cancel(q.key, err, err == nil || status.Code(err) == codes.Canceled))
	}
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
	held := s.dropHoldLocked(id)
	s.unlock()
	if q == nil {
		return held
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
	// omitFirst: remote KV and nothing generated yet: choice 0's first
	// token (the KV commit's) is the prefill worker's to carry to the
	// caller; it is not streamed.
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
	// migrate is the worker a live migration pulls the sequence's KV
	// from (GenerateRequest.migrate_from; nil: none), migrateCodec the
	// pull's codec.
	migrate      *pdservev1.PeerPrefix
	migrateCodec string
	// priority is the request's class when the batch is full
	// (GenerateRequest.priority).
	priority vocab.Priority
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
	if p.priority, err = wire.FromPriority(req.GetPriority()); err != nil {
		return p, invalid("request %s: %v", id, err)
	}
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
	if p.migrate = req.GetMigrateFrom(); p.migrate != nil {
		if !p.local || len(p.generated) == 0 || p.n != 1 || p.promptTop >= 0 {
			return p, invalid("request %s: migrate_from needs local_prefill, generated_tokens, n 1 and no prompt_logprobs", id)
		}
		p.peer, p.migrateCodec = nil, req.GetMigrateCodec()
	}
	// With remote KV the caller has choice 0's position 0 from the
	// prefill worker (FirstToken); a recovery streams only tokens after
	// generated_tokens anyway. first_token_from_prefill, which a
	// coordinator still sends for workers of the previous release, is
	// not read.
	p.omitFirst = !p.local && len(p.generated) == 0
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
	var stamps map[vocab.Stamp]int64 // the first of each stamp sent, when the call is traced
	if tracing.Recording(ctx) {
		called := s.now().UnixNano()
		stamps = map[vocab.Stamp]int64{}
		defer func() { traceSteps(ctx, called, stamps) }()
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
	p.pull = plan != nil || p.migrate != nil
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
	switch {
	case p.migrate != nil:
		// A migrated sequence's KV, pulled as a prefix is.
		s.migrateDone(q, s.pullMigrated(ctx, p))
	case plan != nil:
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
						if k := wire.FromStampKind(st.GetKind()); stamps[k] == 0 {
							stamps[k] = st.GetUnixNano()
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
	defer s.unlock()
	if q := s.seqs[id]; q != nil {
		return slices.Clone(q.reservation.resPrompt)
	}
	return nil
}

// traceSteps records the worker's steps of a traced Generate call from
// the stamps it sent: the KV received, a local prefill, the wait to join
// the batch (from called, when the call came), and the generation.
func traceSteps(ctx context.Context, called int64, stamps map[vocab.Stamp]int64) {
	tracing.Step(ctx, tracing.SpanKVReceive, stamps[StampKVFirstByte], stamps[StampKVDone])
	tracing.Step(ctx, tracing.SpanPrefillCompute, stamps[StampPrefillStart], stamps[StampPrefillEnd])
	tracing.Step(ctx, tracing.SpanDecodeWait, called, stamps[StampJoined])
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
// (countStalled). The caller holds no lock; the batch cancels such a
// request itself (an outbox over its bound: batch.Stalled).
func (s *Server) stalled(q *sequence, reason string, err error) {
	s.mu.Lock()
	defer s.unlock()
	if q.done || q.stalled {
		return // it ended meanwhile
	}
	s.endOrCancelLocked(q, err)
	s.countStalled(q, reason)
}

// countStalled drops the output waiting in the outbox of root q, whose
// caller does not read and which ends, and counts and logs it, once. The
// caller holds mu.
func (s *Server) countStalled(q *sequence, reason string) {
	if q.stalled {
		return
	}
	q.stalled = true
	pending := q.out.pending()
	q.out.drop()
	s.m.stalled(reason)
	s.log.Warn("caller stopped reading: request cancelled", zap.String("request_id", q.id), zap.String("reason", reason),
		zap.String("caller", q.caller), zap.Int("pending_bytes", pending))
}

// attach binds a Generate call to its reservation (or a new one) and
// hands it to the batch (handLocked), unless a peer pull is under way.
// It claims the request under mu, then hands the claim to the KV
// receiver holding no lock of the service (claimKV), then completes it
// under mu again (attached). A request that ended in between (a
// Cancel, an aborted transfer) finished the call's outbox with its
// error, which the call then reads.
func (s *Server) attach(p genParams) (*sequence, error) {
	q, limit, err := s.claim(p)
	if err != nil {
		return nil, err
	}
	held, abort, err := s.claimKV(q, p, limit)
	return s.attached(q, p, held, abort, err)
}

// claim is attach's first part, under mu: it finds or makes p's
// reservation, grows it to p's need, checks p's prompt against what
// Reserve was shown, and marks it attached with the call's outbox, so
// that no other call claims it. It returns the tokens reserved.
func (s *Server) claim(p genParams) (*sequence, int, error) {
	s.mu.Lock()
	defer s.unlock()
	if s.stopped {
		return nil, 0, errStopped
	}
	need := needTokens(len(p.prompt), p.maxTokens, p.n)
	q := s.seqs[p.id]
	switch {
	case q == nil && s.sig.DrainingLocked():
		return nil, 0, status.Error(codes.Unavailable, "decode: worker is draining")
	case q == nil:
		var err error
		if q, err = s.reserveLocked(p.id, need, p.caller); err != nil {
			return nil, 0, err
		}
	case q.attached:
		return nil, 0, status.Errorf(codes.AlreadyExists, "decode: request %s already has a Generate call", p.id)
	}
	if q.resTokens < need {
		// Grow a reservation made for fewer tokens, charged to whoever
		// made it.
		grow := s.pool.BlocksFor(need) - len(q.blocks)
		if err := s.checkCapsLocked(q.caller, p.id, 0, grow); err != nil {
			return nil, 0, err
		}
		more, err := s.allocateLocked(grow)
		if err != nil {
			return nil, 0, status.Errorf(codes.ResourceExhausted, "decode: request %s reserved %d tokens, needs %d: %v", p.id, q.resTokens, need, err)
		}
		s.chargeLocked(q.caller, 0, len(more))
		q.blocks = append(q.blocks, more...)
		q.resTokens = len(q.blocks) * s.pool.BlockTokens()
	}
	switch {
	case !p.local && q.hit.Tokens > 0 && (len(p.hashes) < len(q.hit.Hashes) || !slices.Equal(p.hashes[:len(q.hit.Hashes)], q.hit.Hashes)):
		return nil, 0, invalid("request %s: the prompt differs from the one reserved (its cached prefix of %d tokens)", p.id, q.hit.Tokens)
	case q.reservation.resPrompt != nil && !slices.Equal(p.prompt, q.reservation.resPrompt):
		return nil, 0, invalid("request %s: the prompt (%d tokens) differs from the one reserved (%d tokens)", p.id, len(p.prompt), len(q.reservation.resPrompt))
	}
	q.attached = true
	q.out = newOutbox(p.n, s.o.MaxOutboxBytes)
	if p.omitFirst {
		q.out.omitFirst()
	}
	return q, q.resTokens, nil
}

// attached is attach's last part, under mu, after the receiver took the
// claim (claimKV: held is the KV received before it; err its refusal,
// abort when the transfer failed, which ends q). A refused claim leaves
// the reservation to another call, with a new TTL.
func (s *Server) attached(q *sequence, p genParams, held *batch.KV, abort bool, err error) (*sequence, error) {
	s.mu.Lock()
	defer s.unlock()
	switch {
	case abort:
		// Not handed to the batch yet: the service ends it.
		s.endLocked(q, "", err)
		return nil, err
	case err != nil:
		if q.done {
			return nil, err
		}
		q.attached, q.out = false, nil
		if q.ttl != nil {
			q.ttl.Stop()
			s.armLocked(q)
		}
		return nil, err
	case q.done:
		// It ended since claim: its outbox holds the error.
		if held != nil && held.Free != nil {
			held.Free()
		}
		p.closeGrammars()
		return q, nil
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
	q.join = &batch.Request{
		Key: q.key, ID: q.id, Local: p.local, Prompt: p.prompt, Sampling: p.sampling, MaxTokens: p.maxTokens,
		IgnoreEOS: p.ignoreEOS, Stop: p.stop, Generated: p.generated, N: p.n, GenChoices: p.genChoices,
		Top: p.top, PromptTop: p.promptTop, Hashes: p.hashes, Constraint: p.constraint, ForkStates: p.forkStates,
		Disk: p.disk, KV: held, Out: q.out, Priority: p.priority,
	}
	q.pulling = p.pull
	s.handLocked(q)
	return q, nil
}

// claimKV hands Generate call p's claim of q to the KV receiver, in one
// critical section of rx.mu with the checks of the call against the
// transfer: FAILED_PRECONDITION for local prefill when KV was sent or
// is arriving, INVALID_ARGUMENT when the KV received does not cover the
// prompt, ABORTED (abort: q is to be ended) when the transfer failed.
// It also hands over the reservation's size (limit tokens), which claim
// may have grown, and returns the KV received before the claim (nil:
// none yet), for the Join. The caller holds no lock: a transfer that
// aborts meanwhile either is seen here or sees the claim (and ends q).
func (s *Server) claimKV(q *sequence, p genParams, limit int) (held *batch.KV, abort bool, err error) {
	s.rx.mu.Lock()
	defer s.rx.mu.Unlock()
	s.rx.register(q)
	q.limit = limit
	switch {
	case p.local && (q.sink != nil || q.committed):
		return nil, false, status.Errorf(codes.FailedPrecondition, "decode: request %s asks for local prefill but its kv was sent", p.id)
	case !p.local && q.committed && q.kvTokens != len(p.prompt):
		return nil, false, invalid("request %s: prompt has %d tokens, the kv received covers %d", p.id, len(p.prompt), q.kvTokens)
	case !p.local && q.xferErr != nil:
		return nil, true, status.Errorf(codes.Aborted, "decode: kv transfer of %s failed: %v", p.id, q.xferErr)
	}
	q.claimed, q.claimLocal, q.claimPrompt = true, p.local, len(p.prompt)
	held, q.held = q.held, nil
	return held, false, nil
}

// closeGrammar closes c when it is not nil.
func closeGrammar(c engine.GrammarState) {
	if c != nil {
		c.Close()
	}
}

// handLocked hands q to the batch (Join), with the cache pin of Reserve,
// once it has its Generate call and no pull is under way; remote KV
// joins the batch once it arrived there too. The caller holds mu.
func (s *Server) handLocked(q *sequence) {
	if q.done || q.handed || q.join == nil || q.pulling {
		return
	}
	r := q.join
	q.join = nil
	r.Pin, q.hit = q.hit, prefixcache.Hit{}
	q.handed = true
	s.b.Post(batch.Join(r))
	if s.moveOut {
		// Draining by migration: it moves out once it runs (the answer
		// is the batch's end report; nobody waits for the reply).
		s.b.Post(batch.ExportWhenReady(q.key, make(chan batch.Exported, 1)))
	}
}

// MaxBatch returns the most sequences one step runs (Options.MaxBatch):
// the most choices a request may ask.
func (s *Server) MaxBatch() int { return s.o.MaxBatch }

// BlockTokens returns the tokens of one KV block of the pool, the block
// of the prefix hashes too.
func (s *Server) BlockTokens() int { return s.o.BlockTokens }

// capacityEngine is an engine whose KV memory is fixed when it is built
// (llamacpp: the cells of its context and its sequence slots).
type capacityEngine interface {
	KVCapacity() (tokens, seqs int)
}

// poolEngine is an engine that models a device's KV memory (sim: the
// profile's GPU memory beside the weights), in tokens.
type poolEngine interface {
	KVPoolTokens() int
}

// engineMemory returns eng's KV memory in tokens and sequence slots (0:
// no bound): its fixed capacity, or the memory it models; an engine
// without either (ref: the Go heap) has no bound but the pool's.
func engineMemory(eng engine.Engine) (tokens, seqs int) {
	switch e := eng.(type) {
	case capacityEngine:
		return e.KVCapacity()
	case poolEngine:
		return e.KVPoolTokens(), 0
	}
	return 0, 0
}
