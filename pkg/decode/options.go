package decode

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/pdserve/pdserve/pkg/batching"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/peerpull"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// Options configure a Server. Start from DefaultOptions.
type Options struct {
	// KVBlocks is the number of KV blocks in the pool. > 0.
	KVBlocks int
	// BlockTokens is the number of tokens one block holds. > 0.
	BlockTokens int
	// MaxBatch caps the sequences in one step (running decodes plus
	// sequences being prefilled locally). > 0.
	MaxBatch int
	// Budget is the step budget (--chunk-tokens, --max-batch-tokens):
	// ChunkTokens caps one sequence's local prefill chunk in one step;
	// MaxBatchTokens is shared by decode tokens (one per running sequence)
	// and local prefill chunks, and must exceed MaxBatch so that prefill
	// always makes progress.
	batching.Budget
	// ReserveTTL is how long a reservation waits for its Generate call
	// before its blocks are released. > 0.
	ReserveTTL time.Duration
	// MaxReservationsPerCaller caps the requests one caller holds on the
	// worker at once: reservations and Generate calls, from Reserve (or a
	// Generate without one) to the request's end. The caller is the
	// authenticated identity (grpcauth.Caller), else the peer's IP. Over
	// the cap Reserve and Generate fail with RESOURCE_EXHAUSTED. > 0.
	MaxReservationsPerCaller int
	// MaxReservedTokensPerCaller caps the KV tokens (whole blocks) one
	// caller's requests hold at once, as MaxReservationsPerCaller. > 0.
	MaxReservedTokensPerCaller int
	// MaxOutboxBytes bounds the output (tokens and their logprobs, as
	// estimated bytes) one request may have waiting for its Generate
	// call to send it, which happens when the caller does not read its
	// stream: over it the request is cancelled (RESOURCE_EXHAUSTED), its
	// KV, engine sequences and pending output freed, and
	// pdserve_decode_stream_stalled_cancels_total{reason="outbox"}
	// counts it. > 0.
	MaxOutboxBytes int
	// StreamWriteTimeout is the longest one send of a Generate stream may
	// block on a caller that does not read; then the request is cancelled
	// (DEADLINE_EXCEEDED) and freed as above, counted with
	// reason="write_timeout". The blocked send itself ends when the
	// caller reads or goes away. 0: none.
	StreamWriteTimeout time.Duration
	// PrefixCache keeps finished requests' prompt KV in the engine for
	// prefix reuse by local prefill and by remote KV (see the package
	// doc); on by default (MaxTokens prefixcache.Auto: the whole pool,
	// KVBlocks × BlockTokens; 0 turns it off). Its tokens share the pool
	// with requests: they take blocks only while cached, and a request
	// short of free blocks reclaims unpinned entries, so the cache takes
	// nothing from requests and MaxTokens only caps it. Its blocks are
	// BlockTokens tokens (its own BlockTokens is ignored).
	PrefixCache prefixcache.Options
	// PeerLinkGbps is the link a local prefill's pull from a peer worker
	// (a prefix the coordinator says it holds, GenerateRequest.peer) is
	// priced at until pulls from that peer were measured
	// (--peer-link-gbps, default kvtransfer.DefaultPeerLinkGbps): the
	// pull happens when it is faster than computing the prefix at this
	// worker's prefill throughput, measured over its local-prefill steps;
	// 0: the worker pulls nothing and computes every prefix its own cache
	// lacks. Pulls also need the prefix cache and a dialer (WithDialer).
	// ≥ 0.
	PeerLinkGbps float64
	// PeerPullVerifyBlocks is how many blocks of each pull are recomputed
	// here and compared with what the peer sent (peerpull.Check: the
	// pulled chain's last block, then random others): a pull that does
	// not match is dropped, its prompt computed here, the entries cached
	// from that peer dropped, and the peer not pulled from again
	// (--peer-pull-verify-blocks, default peerpull.DefaultCheckBlocks).
	// 0: no check; pulled KV then serves its own request only and is
	// never cached, exported or advertised. ≥ 0.
	PeerPullVerifyBlocks int
}

// Defaults of the per-caller caps: above what one coordinator needs on a
// pool of the default size (every block held by one caller is 65536
// tokens in 4096 requests), yet finite. Lower them when several
// coordinators share the decode workers, or gRPC is open.
const (
	DefaultMaxReservationsPerCaller   = 4096
	DefaultMaxReservedTokensPerCaller = 1 << 22 // 4194304 tokens
)

// Defaults of the bounds on a caller that stops reading: a healthy
// caller takes each step's output at once (a step of 64 choices with 20
// logprobs each is about 90 KB), so 16 MiB is hundreds of steps behind.
const (
	DefaultMaxOutboxBytes     = 16 << 20
	DefaultStreamWriteTimeout = 30 * time.Second
)

// DefaultOptions returns the defaults of the decode-worker flags.
func DefaultOptions() Options {
	return Options{
		KVBlocks:    4096,
		BlockTokens: 16,
		MaxBatch:    64,
		Budget:      batching.DefaultBudget(),
		ReserveTTL:  30 * time.Second,

		MaxReservationsPerCaller:   DefaultMaxReservationsPerCaller,
		MaxReservedTokensPerCaller: DefaultMaxReservedTokensPerCaller,
		MaxOutboxBytes:             DefaultMaxOutboxBytes,
		StreamWriteTimeout:         DefaultStreamWriteTimeout,
		PrefixCache:                prefixcache.DefaultOptions(),
		PeerLinkGbps:               kvtransfer.DefaultPeerLinkGbps,
		PeerPullVerifyBlocks:       peerpull.DefaultCheckBlocks,
	}
}

// AddFlags registers --kv-blocks, --block-tokens, --max-batch,
// --chunk-tokens, --max-batch-tokens (batching.Budget), --reserve-ttl,
// --max-reservations-per-caller, --max-reserved-tokens-per-caller,
// --max-outbox-bytes, --stream-write-timeout, --peer-link-gbps,
// --peer-pull-verify-blocks and the
// prefix cache's flags (prefixcache.Options.AddFlags) on fs, with o's
// values as defaults.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.KVBlocks, "kv-blocks", o.KVBlocks, "KV blocks in the worker's pool")
	fs.IntVar(&o.BlockTokens, "block-tokens", o.BlockTokens, "tokens per KV block")
	fs.IntVar(&o.MaxBatch, "max-batch", o.MaxBatch, "most sequences in one step (running decodes plus local prefills)")
	o.Budget.AddFlags(fs)
	fs.DurationVar(&o.ReserveTTL, "reserve-ttl", o.ReserveTTL, "how long a reservation waits for its Generate call before its blocks are released")
	fs.IntVar(&o.MaxReservationsPerCaller, "max-reservations-per-caller", o.MaxReservationsPerCaller, "most requests (reservations and Generate calls) one caller holds at once; the caller is its authenticated identity, else its IP")
	fs.IntVar(&o.MaxReservedTokensPerCaller, "max-reserved-tokens-per-caller", o.MaxReservedTokensPerCaller, "most KV tokens (whole blocks) one caller's requests hold at once")
	fs.IntVar(&o.MaxOutboxBytes, "max-outbox-bytes", o.MaxOutboxBytes, "most output bytes (tokens and logprobs) one request may have waiting for a caller that does not read its stream; over it the request is cancelled and freed")
	fs.DurationVar(&o.StreamWriteTimeout, "stream-write-timeout", o.StreamWriteTimeout, "longest one send of a Generate stream may block on a caller that does not read; then the request is cancelled and freed (0: none)")
	o.PrefixCache.AddFlags(fs)
	fs.Float64Var(&o.PeerLinkGbps, "peer-link-gbps", o.PeerLinkGbps, "Gbit/s a local prefill's pull of a cached prefix from a peer worker is priced at until pulls from it were measured: a prompt pulls its prefix when that is faster than computing it at this worker's measured prefill throughput (0: never pull)")
	fs.IntVar(&o.PeerPullVerifyBlocks, "peer-pull-verify-blocks", o.PeerPullVerifyBlocks, "blocks of each prefix a local prefill pulled from a peer that are recomputed here and compared with what it sent (its last block, then random others): a mismatch drops the pulled KV, computes the prompt here and stops pulling from that peer; a verified pull is cached and may be served to peers, tagged with its source (0: no check: pulled KV serves its own request only, never cached, exported or advertised)")
}

// Validate reports every invalid field in one error.
func (o Options) Validate() error {
	var errs []error
	if o.KVBlocks <= 0 {
		errs = append(errs, fmt.Errorf("kv-blocks %d must be positive", o.KVBlocks))
	}
	if o.BlockTokens <= 0 {
		errs = append(errs, fmt.Errorf("block-tokens %d must be positive", o.BlockTokens))
	}
	if o.MaxBatch <= 0 {
		errs = append(errs, fmt.Errorf("max-batch %d must be positive", o.MaxBatch))
	}
	if err := o.Budget.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.MaxBatchTokens <= o.MaxBatch {
		errs = append(errs, fmt.Errorf("max-batch-tokens %d must exceed max-batch %d", o.MaxBatchTokens, o.MaxBatch))
	}
	if o.ReserveTTL <= 0 {
		errs = append(errs, fmt.Errorf("reserve-ttl %v must be positive", o.ReserveTTL))
	}
	if o.MaxReservationsPerCaller <= 0 || o.MaxReservedTokensPerCaller <= 0 {
		errs = append(errs, fmt.Errorf("max-reservations-per-caller %d and max-reserved-tokens-per-caller %d must be positive", o.MaxReservationsPerCaller, o.MaxReservedTokensPerCaller))
	}
	if o.MaxOutboxBytes <= 0 {
		errs = append(errs, fmt.Errorf("max-outbox-bytes %d must be positive", o.MaxOutboxBytes))
	}
	if o.StreamWriteTimeout < 0 {
		errs = append(errs, fmt.Errorf("stream-write-timeout %v must not be negative", o.StreamWriteTimeout))
	}
	if !(o.PeerLinkGbps >= 0) {
		errs = append(errs, fmt.Errorf("peer-link-gbps %v must not be negative", o.PeerLinkGbps))
	}
	if o.PeerPullVerifyBlocks < 0 {
		errs = append(errs, fmt.Errorf("peer-pull-verify-blocks %d must not be negative", o.PeerPullVerifyBlocks))
	}
	pc := o.cacheOptions()
	if err := pc.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("decode: invalid options: %w", err)
	}
	return nil
}

// cacheOptions returns the prefix cache's options with the pool's block
// size.
func (o Options) cacheOptions() prefixcache.Options {
	pc := o.PrefixCache
	pc.BlockTokens = o.BlockTokens
	return pc
}
