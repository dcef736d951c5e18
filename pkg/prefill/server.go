package prefill

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/batching"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/grammar"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/kv/codec"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/kvtransfer/codecpick"
	"github.com/pdserve/pdserve/pkg/peerpull"
	"github.com/pdserve/pdserve/pkg/prefill/batch"
	"github.com/pdserve/pdserve/pkg/prefixcache"
	"github.com/pdserve/pdserve/pkg/tracing"
	"github.com/pdserve/pdserve/pkg/wire"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// errStopped fails requests still live when the batch stops.
var errStopped = status.Error(codes.Unavailable, "prefill: worker stopping")

// Server is a prefill worker: the PrefillService handlers (the service)
// and the batch that prefills their prompts on one engine. Create it with
// New, register it on a gRPC server with Register, and run the batch with
// Run.
type Server struct {
	pdservev1.UnimplementedPrefillServiceServer

	spec engine.ModelSpec
	eng  engine.Engine
	// b is the batch (chunked prefill by priority); it owns the engine, the
	// requests' engine sequences and the prefix cache's. The service
	// posts it messages and hears back through each request (its Outbox).
	b *batch.Batch
	// grammars makes the grammar states of structured output (the
	// engine's own sampler, or the Go mask).
	grammars *grammar.Source
	dialer   *kvtransfer.Dialer
	auto     *kvtransfer.CodecChooser // chooses codecs for CodecAuto, measures every transfer's link
	o        Options
	log      *zap.Logger
	m        *metrics
	now      func() time.Time
	// cache holds finished prompts' engine sequences (nil: off). Only the
	// batch's loop, which owns the engine, looks up, forks, inserts and
	// frees them; peers' exports read them under the engine lock; the
	// handlers hash prompts and read the disk tier; Stats reads it from
	// any goroutine.
	cache *prefixcache.Cache
	// peers prices pulls of a prefix from a peer worker.
	peers *kvtransfer.PullPricer
	// trust holds the peers whose pulled KV failed a spot check.
	trust peerpull.Trust

	// sig wakes the batch's loop, and holds draining and the end of each
	// live request (its ...Locked methods under mu).
	sig     *batching.Signals
	baseCtx context.Context
	stop    context.CancelFunc
	xfers   sync.WaitGroup // sender goroutines

	// mu is the service's one lock: it guards what follows and the
	// requests' fields below their line. It is never held across a call
	// into the batch but Post (the mailbox, a leaf), nor while waiting
	// for the loop.
	mu         sync.Mutex
	live       map[string]*request // every request whose Prefill call has not ended
	nextKey    uint64              // the last batch.Request.Key given
	queued     int                 // live requests in the batch (inBatch)
	retained   *retainStore
	tokenBytes int   // bytes of one token in one layer the engine hands out; > 0 (see New)
	liveKV     int64 // Σ kvBytes of the live requests
	stopped    bool
}

// request is one Prefill call, and the batch's Outbox of it (outbox.go).
// Fields below the line are guarded by Server.mu.
type request struct {
	s        *Server
	key      uint64 // batch.Request.Key
	id       string
	prompt   []int32 // the batch's Request.Prompt: read only
	top      int     // logprob alternatives of the first token; -1: no logprob
	addr     string
	decodeID string // the decode worker's heartbeat id (may be empty)
	cred     string // the push credential for it (may be empty)
	codec    string
	skip     int // the KV stream starts at this token (the decode worker's prefix hit)
	queuedAt time.Time
	kvBytes  int64      // KV estimate charged to Server.liveKV while live
	events   chan event // capacity 2: at most one first token and one end
	learnt   bool       // the batch's loop only: tokenBytes learnt from kv

	inBatch bool // joined the batch, not yet ended there (Outbox.End)
	ended   bool // the end event was sent; no longer live
	// kv, tx and ret are set when the batch starts the request
	// (Outbox.Start); the loop reads kv and tx without mu after that.
	kv  *kvBuf
	tx  *transfer
	ret *retained
}

// event goes from the batch (through the request's Outbox) or a sender
// goroutine to the request's handler. Exactly one of the fields is set.
type event struct {
	first *pdservev1.FirstToken
	done  *pdservev1.KVDone
	err   error
}

// New returns a Server running on eng and sending KV through dialer (the
// Server does not close it). reg receives the worker's metrics (nil: none
// are exported). The batch does not run until Run is called.
func New(eng engine.Engine, dialer *kvtransfer.Dialer, o Options, logger *zap.Logger, reg prometheus.Registerer) (*Server, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	spec := eng.Spec()
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("prefill: %w", err)
	}
	if err := codecSupports(o.Codec, spec.KVDType); err != nil {
		return nil, fmt.Errorf("prefill: %w", err)
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	ctx, stop := context.WithCancel(context.Background())
	var err error
	s := &Server{
		spec:     spec,
		grammars: grammar.ForEngine(eng),
		dialer:   dialer,
		o:        o,
		log:      logger,
		now:      time.Now,
		sig:      batching.NewSignals(),
		baseCtx:  ctx,
		stop:     stop,
		live:     make(map[string]*request),
		retained: newRetainStore(o.RetainBytes),
		peers:    kvtransfer.NewPullPricer(o.PeerLinkGbps),
	}
	// The KV of a token as the engine hands it out: the model's size, or
	// less for an engine that ships a scaled-down payload and says so
	// (the performance-model engine). The first chunk seen corrects it.
	s.tokenBytes = spec.KVTokenBytes()
	if e, ok := eng.(interface{ KVTokenBytes() int }); ok && e.KVTokenBytes() > 0 {
		s.tokenBytes = e.KVTokenBytes()
	}
	memTokens, memSeqs := engineMemory(eng, o.RetainBytes)
	_, forks := eng.(engine.Forker)
	auto := memTokens
	if !forks {
		auto = 0 // Auto keeps nothing on an engine that cannot fork
	}
	s.o.PrefixCache = o.PrefixCache.Resolve(auto)
	if pc := &s.o.PrefixCache; pc.Enabled() && memSeqs > 0 && pc.MaxEntries > memSeqs-1 {
		// Cached prompts hold sequence slots; one stays for a request.
		pc.MaxEntries = memSeqs - 1
		if pc.MaxEntries <= 0 {
			pc.MaxTokens = 0
		}
	}
	if s.cache, err = prefixcache.New(s.o.PrefixCache); err != nil {
		stop()
		return nil, fmt.Errorf("prefill: %w", err)
	}
	if s.cache != nil && !forks {
		stop()
		return nil, errors.New("prefill: a prefix cache needs an engine that forks sequences")
	}
	m, err := newMetrics(reg, s)
	if err != nil {
		stop()
		return nil, err
	}
	s.m = m
	s.auto = kvtransfer.NewCodecChooser(spec.KVDType)
	s.eng = eng
	s.b = batch.New(batch.Config{
		Engine:         eng,
		Cache:          s.cache,
		MaxBatchTokens: o.MaxBatchTokens,
		ChunkTokens:    o.ChunkTokens,
		MemTokens:      memTokens,
		MemSeqs:        memSeqs,
		Overtakes:      batching.DefaultOvertakes,
		Signals:        s.sig,
		Stopped:        ctx,
		Observe:        s.m.observeStep,
		ObservePrefill: s.peers.ObserveStep,
		Stop:           s.stopping,
		Log:            logger,
		Now:            func() time.Time { return s.now() },
	})
	if auto, _ := codecpick.AutoName(o.Codec); auto {
		// The default chooses per transfer: benchmark the codecs now, not
		// in the first request's transfer.
		sp, err := s.auto.Speeds()
		if err != nil {
			stop()
			return nil, fmt.Errorf("prefill: codec self-benchmark: %w", err)
		}
		logSpeeds(logger, sp)
	}
	return s, nil
}

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
// without either (ref: the Go heap) gets the worker's KV budget,
// retainBytes of the model's KV.
func engineMemory(eng engine.Engine, retainBytes int64) (tokens, seqs int) {
	switch e := eng.(type) {
	case capacityEngine:
		return e.KVCapacity()
	case poolEngine:
		return e.KVPoolTokens(), 0
	}
	if b := int64(eng.Spec().KVBytesPerToken()); b > 0 {
		return int(min(retainBytes/b, math.MaxInt32)), 0
	}
	return 0, 0
}

// logSpeeds logs the self-benchmark's figures.
func logSpeeds(log *zap.Logger, sp codec.Speeds) {
	for _, c := range sp.Codecs {
		log.Info("codec self-benchmark", zap.String("codec", c.Codec), zap.Stringer("dtype", sp.DType),
			zap.Float64("encode_mb_per_s_per_core", c.EncodeBytesPerSec/1e6), zap.Float64("decode_mb_per_s_per_core", c.DecodeBytesPerSec/1e6),
			zap.Float64("ratio", c.Ratio), zap.Bool("cpu_time", sp.CPUTime))
	}
}

// SetReceivers gives the worker what decode workers say of their decoding
// (their heartbeats), by gRPC address, for the codec choice of CodecAuto
// and CodecAutoLossy; without it (or for an address f does not know) the
// receiver's decode speed is unknown (see pkg/kvtransfer/codecpick). f is
// called from sender goroutines, concurrently. Safe to call at any time.
func (s *Server) SetReceivers(f func(addr string) (kvtransfer.ReceiverSpeeds, bool)) {
	s.auto.SetReceivers(f)
}

// Register registers the PrefillService on g, and the KV transfer
// service for peers' pulls of its cached prefixes (KVTransferService/Pull).
func (s *Server) Register(g grpc.ServiceRegistrar) {
	pdservev1.RegisterPrefillServiceServer(g, s)
	// Peers pull cached prefixes from it; it receives no KV pushes.
	kvtransfer.Register(g, nil, s.spec.KVDType, kvtransfer.WithPullSource(s), kvtransfer.WithLogger(s.log.Named("kvtransfer")))
}

// Stats is a snapshot of the worker's load, for heartbeats.
type Stats struct {
	QueuedRequests      int       // requests waiting or prefilling
	QueuedPrefillTokens int       // prompt tokens not yet prefilled
	Live                int       // requests whose Prefill call has not ended
	LastBatch           int       // requests in the last step
	RetainedBytes       int64     // KV bytes held (in flight and retained)
	StepTimesMs         []float64 // recent step times, oldest first; a copy
	Draining            bool
	// PrefixCache is the prefix cache's counters and occupancy (zero when
	// it is off).
	PrefixCache prefixcache.Stats
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

// BlockTokens returns the block size of the worker's prefix hashes
// (Options.PrefixCache.BlockTokens), also with the cache off; with
// ExportPrefix it makes the Server a kvtransfer.PullSource.
func (s *Server) BlockTokens() int { return s.o.PrefixCache.BlockTokens }

// Stats returns a snapshot of the worker's load.
func (s *Server) Stats() Stats {
	times, last := s.b.Steps()
	ld := s.b.Load()
	st := Stats{
		QueuedPrefillTokens: ld.QueuedPrefillTokens,
		LastBatch:           last,
		StepTimesMs:         times,
		PrefixCache:         s.cache.Stats(),
	}
	s.mu.Lock()
	st.QueuedRequests = s.queued
	st.Live = len(s.live)
	st.RetainedBytes = s.retained.total
	st.Draining = s.sig.DrainingLocked()
	s.mu.Unlock()
	return st
}

// SetDraining marks the worker draining: new Prefill calls fail with
// UNAVAILABLE, live ones finish. Resend and Release still work.
func (s *Server) SetDraining(d bool) {
	s.mu.Lock()
	s.sig.SetDrainingLocked(d)
	s.mu.Unlock()
}

// WaitIdle blocks until no Prefill call is live, or ctx ends (returning its
// error).
func (s *Server) WaitIdle(ctx context.Context) error {
	return s.sig.WaitIdle(ctx, &s.mu, func() int { return len(s.live) })
}

// Cancel stops the live request id as if its caller had cancelled it. It
// reports whether such a request existed.
func (s *Server) Cancel(id string) bool {
	s.mu.Lock()
	r := s.live[id]
	s.mu.Unlock()
	if r == nil {
		return false
	}
	s.cancel(r, status.Error(codes.Canceled, "prefill: request cancelled by command"))
	return true
}

// Prefill implements PrefillService.Prefill. Its events are one
// PrefillQueued, one FirstToken once the prompt is prefilled and one KVDone
// once the decode worker acknowledged the KV; then the stream ends.
// Errors: INVALID_ARGUMENT for a bad request, ALREADY_EXISTS when the id is
// live, RESOURCE_EXHAUSTED at once when the queue is full
// (Options.MaxLivePrefills requests, or Options.MaxLiveKVBytes of KV), UNAVAILABLE
// when the worker drains or stops, CANCELED, and when the KV transfer
// fails, the decode worker's status (e.g. FAILED_PRECONDITION without a
// reservation) or UNAVAILABLE, marked so that wire.IsKVTransferFailed reports it.
func (s *Server) Prefill(req *pdservev1.PrefillRequest, stream grpc.ServerStreamingServer[pdservev1.PrefillResponse]) error {
	ctx := stream.Context()
	// The prompt's block hashes (keyed SHA-256, rooted in its tenant),
	// computed once for the pull, the disk read and the queue.
	hashes := s.cache.Hashes(kv.Hash(req.GetPrefixRoot()), req.GetPromptTokens())
	pulled := s.pullPrefix(ctx, req, hashes)
	// A file the disk tier holds is read here, not under the engine lock
	// where the prefix is imported.
	disk := s.cache.ReadDisk(ctx, hashes, s.cache.MaxHitBlocks(len(req.GetPromptTokens())))
	r, pos, err := s.enqueue(req, hashes, pulled, disk)
	if err != nil {
		return err
	}
	if err := stream.Send(&pdservev1.PrefillResponse{Event: &pdservev1.PrefillResponse_Queued{Queued: &pdservev1.PrefillQueued{
		UnixNano: r.queuedAt.UnixNano(), QueuePosition: int32(pos),
	}}}); err != nil {
		s.cancel(r, err)
		return err
	}
	for {
		select {
		case ev := <-r.events:
			switch {
			case ev.err != nil:
				return ev.err
			case ev.first != nil:
				tracing.Step(ctx, tracing.SpanPrefillCompute, ev.first.GetPrefillStartUnixNano(), ev.first.GetPrefillEndUnixNano(),
					tracing.AttrPrefixHit.Int(int(ev.first.GetHit().GetTokens())), tracing.AttrBatchSize.Int(int(ev.first.GetBatchSize())))
				if err := stream.Send(&pdservev1.PrefillResponse{Event: &pdservev1.PrefillResponse_FirstToken{FirstToken: ev.first}}); err != nil {
					s.cancel(r, err)
					return err
				}
			case ev.done != nil:
				d := ev.done
				tracing.Step(ctx, tracing.SpanKVPush, d.GetFirstByteUnixNano(), d.GetDoneUnixNano(), tracing.KVAttrs(d.GetCodec(), d.GetBytesRaw(), d.GetBytesWire())...)
				return stream.Send(&pdservev1.PrefillResponse{Event: &pdservev1.PrefillResponse_KvDone{KvDone: ev.done}})
			}
		case <-ctx.Done():
			err := status.FromContextError(context.Cause(ctx)).Err()
			s.cancel(r, err)
			return err
		}
	}
}

// checkPrompt reports an empty prompt, one that leaves no room for a
// generated token, or a token outside the vocabulary.
func checkPrompt(spec engine.ModelSpec, prompt []int32) error {
	if len(prompt) == 0 {
		return errors.New("prompt_tokens is empty")
	}
	if len(prompt) >= spec.MaxSeqLen {
		return fmt.Errorf("prompt of %d tokens leaves no room under the model's maximum of %d", len(prompt), spec.MaxSeqLen)
	}
	for i, t := range prompt {
		if t < 0 || int(t) >= spec.Vocab {
			return fmt.Errorf("prompt token %d is %d, outside the vocabulary [0, %d)", i, t, spec.Vocab)
		}
	}
	return nil
}

func checkID(id string) error {
	if id == "" || len(id) > vocab.MaxRequestID {
		return fmt.Errorf("request_id must have 1 to %d bytes, has %d", vocab.MaxRequestID, len(id))
	}
	return nil
}

// codecSupports reports whether the codec called name exists and can carry
// KV of dtype dt; CodecAuto and CodecAutoLossy always can. Errors: codec.ErrUnknownCodec, codec.ErrDType.
func codecSupports(name string, dt engine.DType) error {
	if auto, _ := codecpick.AutoName(name); auto {
		return nil // chooses among the codecs that take dt
	}
	c, err := codec.ByName(name)
	if err != nil {
		return err
	}
	if err := c.Supports(dt); err != nil {
		return fmt.Errorf("codec %q for the engine's %v kv: %w", name, dt, err)
	}
	return nil
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "prefill: "+format, args...)
}

// enqueue validates req and queues it, with the prefix pulled from a peer
// and the one read from the disk tier (either nil: none). It returns the
// request and its 0-based position in the queue.
func (s *Server) enqueue(req *pdservev1.PrefillRequest, hashes []kv.Hash, pulled *prefixcache.Pulled, disk *prefixcache.DiskRead) (*request, int, error) {
	if err := checkID(req.GetRequestId()); err != nil {
		return nil, 0, invalid("%v", err)
	}
	if err := checkPrompt(s.spec, req.GetPromptTokens()); err != nil {
		return nil, 0, invalid("request %s: %v", req.GetRequestId(), err)
	}
	if req.GetDecodeAddr() == "" {
		return nil, 0, invalid("request %s: decode_addr is empty", req.GetRequestId())
	}
	codecName := req.GetCodec()
	if codecName == "" {
		codecName = s.o.Codec
	}
	if err := codecSupports(codecName, s.spec.KVDType); err != nil {
		return nil, 0, invalid("request %s: %v", req.GetRequestId(), err)
	}
	sampling, err := wire.FromSampling(req.GetSampling())
	if err != nil {
		return nil, 0, invalid("request %s: %v", req.GetRequestId(), err)
	}
	prio, err := wire.FromPriority(req.GetPriority())
	if err != nil {
		return nil, 0, invalid("request %s: %v", req.GetRequestId(), err)
	}
	var gs engine.GrammarState
	queued := false
	if sampling.Grammar != "" {
		// The first token is sampled at the grammar's start; the decode
		// worker advances its own state over it.
		mask, err := s.grammars.Constrain(sampling.Grammar, nil)
		if err != nil {
			return nil, 0, invalid("request %s: %v", req.GetRequestId(), err)
		}
		// Closed once the first token is sampled, or when the request
		// ends or is not queued.
		sampling.Constraint, gs = mask, mask
		defer func() {
			if !queued {
				mask.Close()
			}
		}()
	}
	top, err := wire.FromLogprobs(req.GetLogprobs())
	if err != nil {
		return nil, 0, invalid("request %s: %v", req.GetRequestId(), err)
	}
	if skip := int(req.GetSkipTokens()); skip < 0 || skip >= len(req.GetPromptTokens()) {
		return nil, 0, invalid("request %s: skip_tokens %d outside [0, %d)", req.GetRequestId(), skip, len(req.GetPromptTokens()))
	}
	r := &request{
		s:        s,
		id:       req.GetRequestId(),
		prompt:   slices.Clone(req.GetPromptTokens()),
		top:      top,
		addr:     req.GetDecodeAddr(),
		decodeID: req.GetDecodeId(),
		cred:     req.GetDecodeCredential(),
		codec:    codecName,
		skip:     int(req.GetSkipTokens()),
		queuedAt: s.now(),
		events:   make(chan event, 2),
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.stopped || s.sig.DrainingLocked():
		return nil, 0, status.Error(codes.Unavailable, "prefill: worker is draining")
	case s.live[r.id] != nil:
		return nil, 0, status.Errorf(codes.AlreadyExists, "prefill: request %s is already live", r.id)
	case len(s.live) >= s.o.MaxLivePrefills:
		return nil, 0, status.Errorf(codes.ResourceExhausted, "prefill: queue full (%d live requests)", len(s.live))
	}
	r.kvBytes = int64(len(r.prompt)) * int64(s.spec.Layers) * int64(s.tokenBytes)
	if limit := s.o.liveKVLimit(); len(s.live) > 0 && s.liveKV+r.kvBytes > limit {
		return nil, 0, status.Errorf(codes.ResourceExhausted,
			"prefill: queue full (%d live requests hold %d bytes of KV; %d more exceed the bound of %d)", len(s.live), s.liveKV, r.kvBytes, limit)
	}
	// A new prefill of an id replaces KV retained from an earlier one.
	s.retained.drop(r.id)
	s.live[r.id] = r
	s.liveKV += r.kvBytes
	s.nextKey++
	r.key = s.nextKey
	pos := s.queued
	// Posted under mu, so that no Join follows the batch's Stop
	// (stopping): the mailbox is a leaf.
	s.b.Post(batch.Join(&batch.Request{
		Key: r.key, ID: r.id, Prompt: r.prompt, Sampling: sampling, Grammar: gs,
		Hashes: hashes, Pulled: pulled, Disk: disk, Out: r, Priority: prio,
	}))
	r.inBatch = true
	s.queued++
	queued = true
	return r, pos, nil
}

// endLocked sends r's last event, takes it out of the batch if it is
// there (batch.Cancel) and forgets it. Idempotent.
func (s *Server) endLocked(r *request, ev event) {
	if r.ended {
		return
	}
	r.ended = true
	if r.inBatch {
		// The batch frees its sequence at the next step boundary.
		s.b.Post(batch.Cancel(r.key))
		s.leftBatchLocked(r)
	}
	r.events <- ev
	delete(s.live, r.id)
	s.liveKV -= r.kvBytes
	s.sig.EndedLocked()
}

// leftBatchLocked notes that r is no longer in the batch.
func (s *Server) leftBatchLocked(r *request) {
	if r.inBatch {
		r.inBatch = false
		s.queued--
	}
}

// cancel stops r: out of the batch (its engine sequence is freed at the
// next step boundary: batch.Cancel), transfer aborted, KV dropped.
func (s *Server) cancel(r *request, cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.ended {
		return
	}
	if r.tx != nil {
		r.tx.abort(cause)
	}
	if r.ret != nil && s.retained.get(r.id) == r.ret {
		s.retained.drop(r.id)
	}
	s.endLocked(r, event{err: cause})
	s.sig.Wake()
}

// Resend implements PrefillService.Resend: it sends the KV retained for
// request_id to decode_addr (which must hold a reservation) and returns once
// that worker acknowledged it. Errors: INVALID_ARGUMENT, NOT_FOUND when no
// KV is retained for the id (never prefilled here, released or evicted),
// FAILED_PRECONDITION while its prefill still runs, the decode worker's
// status when the transfer fails.
func (s *Server) Resend(ctx context.Context, req *pdservev1.ResendRequest) (*pdservev1.ResendResponse, error) {
	id := req.GetRequestId()
	if err := checkID(id); err != nil {
		return nil, invalid("%v", err)
	}
	if req.GetDecodeAddr() == "" {
		return nil, invalid("request %s: decode_addr is empty", id)
	}
	codecName := req.GetCodec()
	if codecName == "" {
		codecName = s.o.Codec
	}
	if err := codecSupports(codecName, s.spec.KVDType); err != nil {
		return nil, invalid("request %s: %v", id, err)
	}
	s.mu.Lock()
	e := s.retained.get(id)
	switch {
	case e == nil:
		s.mu.Unlock()
		return nil, status.Errorf(codes.NotFound, "prefill: no kv retained for request %s (released, evicted or never prefilled here)", id)
	case !e.complete:
		s.mu.Unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "prefill: request %s is still being prefilled", id)
	}
	s.retained.pin(e)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.retained.unpin(e, s.now())
		s.mu.Unlock()
		s.sig.Wake()
	}()

	t := newTransfer(peerContext(ctx, req.GetDecodeId(), req.GetDecodeCredential()), id, req.GetDecodeAddr(), codecName, s.spec.KVDType, e.kv, 0, s.spec.KVTokenBytes(), s.auto, s.now)
	for _, f := range e.kv.frames {
		t.push(f)
	}
	t.seal(e.first, e.firstLP)
	res := t.run(s.dialer)
	s.m.addBytes(res.codec, res.bytesRaw, res.bytes)
	if res.err != nil {
		return nil, wire.KVTransferFailedStatus(id, req.GetDecodeAddr(), res.err)
	}
	s.log.Debug("kv re-sent", zap.String("request_id", id), zap.String("decode_addr", req.GetDecodeAddr()),
		zap.String("codec", res.codec), zap.String("codec_reason", res.reason),
		zap.Int64("bytes_raw", res.bytesRaw), zap.Int64("bytes_wire", res.bytes))
	d := kvDone(res)
	tracing.Step(ctx, tracing.SpanKVPush, d.GetFirstByteUnixNano(), d.GetDoneUnixNano(), tracing.KVAttrs(d.GetCodec(), d.GetBytesRaw(), d.GetBytesWire())...)
	return &pdservev1.ResendResponse{KvDone: d}, nil
}

// Release implements PrefillService.Release: it drops the KV retained for
// request_id. Unknown ids are not an error; a Resend in progress keeps its
// copy until it ends.
func (s *Server) Release(_ context.Context, req *pdservev1.ReleaseRequest) (*pdservev1.ReleaseResponse, error) {
	if err := checkID(req.GetRequestId()); err != nil {
		return nil, invalid("%v", err)
	}
	s.mu.Lock()
	s.retained.drop(req.GetRequestId())
	s.mu.Unlock()
	s.sig.Wake()
	return &pdservev1.ReleaseResponse{}, nil
}

func kvDone(res transferResult) *pdservev1.KVDone {
	return &pdservev1.KVDone{
		FirstByteUnixNano: unixNano(res.ack.FirstByte),
		DoneUnixNano:      unixNano(res.ack.Done),
		BytesRaw:          res.bytesRaw,
		BytesWire:         res.bytes,
		Codec:             res.codec,
		CodecReason:       res.reason,
	}
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}
