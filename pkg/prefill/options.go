package prefill

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/pdserve/pdserve/pkg/batching"
	"github.com/pdserve/pdserve/pkg/kv/codec"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/kvtransfer/codecpick"
	"github.com/pdserve/pdserve/pkg/peerpull"
	"github.com/pdserve/pdserve/pkg/prefixcache"
)

// Options configure a Server. Start from DefaultOptions.
type Options struct {
	// Budget is the step budget (--chunk-tokens, --max-batch-tokens): at
	// most ChunkTokens of one request's prompt per step, MaxBatchTokens
	// summed over the batch, which must be ≥ ChunkTokens.
	batching.Budget
	// Codec is the KV codec name used when a request names none: one of
	// pkg/kv/codec's names, or CodecAuto (the lossless codec that delivers
	// each transfer soonest) or CodecAutoLossy (the same among every
	// codec, lossy ones included); see the package doc.
	Codec string
	// MaxLivePrefills bounds the live requests (queued, prefilling or sending
	// KV); beyond it Prefill fails with RESOURCE_EXHAUSTED. > 0.
	MaxLivePrefills int
	// RetainBytes bounds the KV bytes held in memory for requests being
	// prefilled or sent and for finished requests kept for Resend. > 0.
	RetainBytes int64
	// RetainTTL is how long the KV of a finished request is kept for
	// Resend without a Release: the coordinator that would release it
	// may be gone (killed or restarted), and no one else will. A Resend
	// after it finds nothing (NOT_FOUND). > 0.
	RetainTTL time.Duration
	// MaxLiveKVBytes bounds the KV bytes of the live requests (queued,
	// prefilling or sending: KV the worker has yet to compute or deliver);
	// a Prefill whose prompt's KV would take them beyond it fails at once
	// with RESOURCE_EXHAUSTED, unless no request is live. RetainBytes
	// decides how many requests prefill and send at once; the rest wait in
	// the queue, and this bound keeps that wait to about one turnover of
	// the retention bound instead of letting the queue grow until its
	// requests time out elsewhere. 0 means 2 × RetainBytes (as much KV
	// waiting as may be in flight). ≥ 0.
	MaxLiveKVBytes int64
	// PrefixCache keeps the engine sequences of finished prompts for
	// prefix reuse (see the package doc); on by default (MaxTokens
	// prefixcache.Auto: sized by the engine's KV memory; 0: off).
	// Its blocks are PrefixCache.BlockTokens tokens (--block-tokens,
	// default prefixcache.DefaultBlockTokens), the block size the
	// coordinator hashes prompts with for routing: heartbeats carry it,
	// and a coordinator whose --block-tokens differs refuses the worker.
	PrefixCache prefixcache.Options
	// PeerLinkGbps is the link a pull from a peer worker (a prefix the
	// coordinator says it holds, PrefillRequest.peer) is priced at until
	// pulls from that peer were measured (--peer-link-gbps, default
	// DefaultPeerLinkGbps); 0: the worker pulls nothing and computes
	// every prefix its own cache lacks. ≥ 0.
	PeerLinkGbps float64
	// PeerPullVerifyBlocks is how many blocks of each pull are recomputed
	// here and compared with what the peer sent (peerpull.Check: the
	// pulled chain's last block, then random others): a pull that does
	// not match is dropped, its prompt computed here, and the peer not
	// pulled from again (--peer-pull-verify-blocks, default
	// peerpull.DefaultCheckBlocks). 0: no check; pulled KV then serves its
	// own request only and is never cached, exported or advertised. ≥ 0.
	PeerPullVerifyBlocks int
}

// DefaultPeerLinkGbps is the default PeerLinkGbps
// (kvtransfer.DefaultPeerLinkGbps).
const DefaultPeerLinkGbps = kvtransfer.DefaultPeerLinkGbps

// liveKVLimit returns the effective MaxLiveKVBytes.
func (o Options) liveKVLimit() int64 {
	if o.MaxLiveKVBytes > 0 {
		return o.MaxLiveKVBytes
	}
	return 2 * o.RetainBytes
}

// DefaultOptions returns the defaults of the prefill-worker flags.
func DefaultOptions() Options {
	return Options{
		Budget:          batching.DefaultBudget(),
		Codec:           "none",
		MaxLivePrefills: 256,
		RetainBytes:     1 << 30,
		RetainTTL:       10 * time.Minute,
		PrefixCache:     prefixcache.DefaultOptions(),
		PeerLinkGbps:    DefaultPeerLinkGbps,

		PeerPullVerifyBlocks: peerpull.DefaultCheckBlocks,
	}
}

// AddFlags registers --chunk-tokens, --max-batch-tokens (batching.Budget), --codec,
// --max-live-prefills, --retain-bytes, --retain-ttl, --max-live-kv-bytes,
// --peer-link-gbps, --peer-pull-verify-blocks,
// --block-tokens, --prefix-cache-tokens and --prefix-cache-entries on fs,
// with o's values as defaults.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	o.Budget.AddFlags(fs)
	fs.StringVar(&o.Codec, "codec", o.Codec, "KV codec when a request names none: none, s2, zstd, bf16 (also f16: lossless byte planes of bf16 or f16 KV), fp8 or int8 (bf16, fp8 and int8 need bf16 or f16 KV); auto chooses per transfer the lossless codec that delivers soonest (from a codec self-benchmark at start, the link throughput measured per decode worker and its decode speed), auto-lossy the same with fp8 and int8 allowed")
	fs.IntVar(&o.MaxLivePrefills, "max-live-prefills", o.MaxLivePrefills, "most live requests (queued, prefilling or sending KV); more get RESOURCE_EXHAUSTED")
	fs.Int64Var(&o.RetainBytes, "retain-bytes", o.RetainBytes, "bytes of KV held for in-flight requests and for finished ones kept for Resend (LRU eviction)")
	fs.DurationVar(&o.RetainTTL, "retain-ttl", o.RetainTTL, "how long a finished request's KV is kept for Resend when no Release comes (its coordinator may be gone)")
	fs.Int64Var(&o.MaxLiveKVBytes, "max-live-kv-bytes", o.MaxLiveKVBytes, "KV bytes of queued, prefilling and sending requests beyond which new requests get RESOURCE_EXHAUSTED (0: 2 × --retain-bytes)")
	fs.IntVar(&o.PrefixCache.BlockTokens, "block-tokens", o.PrefixCache.BlockTokens, "tokens per block of the prefix hashes and of prefix reuse: must equal the coordinator's and the decode workers' --block-tokens")
	o.PrefixCache.AddFlags(fs)
	fs.Float64Var(&o.PeerLinkGbps, "peer-link-gbps", o.PeerLinkGbps, "Gbit/s a pull of a cached prefix from a peer worker is priced at until pulls from it were measured: a prompt pulls its prefix when that is faster than computing it at this worker's measured prefill throughput (0: never pull)")
	fs.IntVar(&o.PeerPullVerifyBlocks, "peer-pull-verify-blocks", o.PeerPullVerifyBlocks, "blocks of each prefix pulled from a peer that are recomputed here and compared with what it sent (its last block, then random others): a mismatch drops the pulled KV, computes the prompt here and stops pulling from that peer; a verified pull is cached and may be served to peers, tagged with its source (0: no check: pulled KV serves its own request only, never cached, exported or advertised)")
}

// Validate reports every invalid field in one error.
func (o Options) Validate() error {
	var errs []error
	if err := o.Budget.Validate(); err != nil {
		errs = append(errs, err)
	} else if o.MaxBatchTokens < o.ChunkTokens {
		errs = append(errs, fmt.Errorf("max-batch-tokens %d must be at least chunk-tokens %d", o.MaxBatchTokens, o.ChunkTokens))
	}
	if auto, _ := codecpick.AutoName(o.Codec); !auto {
		if _, err := codec.ByName(o.Codec); err != nil {
			errs = append(errs, fmt.Errorf("codec %q: %w", o.Codec, err))
		}
	}
	if o.MaxLivePrefills <= 0 {
		errs = append(errs, fmt.Errorf("max-live-prefills %d must be positive", o.MaxLivePrefills))
	}
	if o.RetainBytes <= 0 {
		errs = append(errs, fmt.Errorf("retain-bytes %d must be positive", o.RetainBytes))
	}
	if o.RetainTTL <= 0 {
		errs = append(errs, fmt.Errorf("retain-ttl %v must be positive", o.RetainTTL))
	}
	if o.PeerLinkGbps < 0 {
		errs = append(errs, fmt.Errorf("peer-link-gbps %v must not be negative", o.PeerLinkGbps))
	}
	if o.PeerPullVerifyBlocks < 0 {
		errs = append(errs, fmt.Errorf("peer-pull-verify-blocks %d must not be negative", o.PeerPullVerifyBlocks))
	}
	if o.MaxLiveKVBytes < 0 {
		errs = append(errs, fmt.Errorf("max-live-kv-bytes %d must not be negative", o.MaxLiveKVBytes))
	}
	if err := o.PrefixCache.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("prefill: invalid options: %w", err)
	}
	return nil
}
