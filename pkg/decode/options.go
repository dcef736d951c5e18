package decode

import (
	"errors"
	"flag"
	"fmt"
	"time"
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
	// ChunkTokens caps the tokens of one sequence's local prefill chunk in
	// one step. > 0.
	ChunkTokens int
	// MaxBatchTokens is the token budget of one step, shared by decode
	// tokens (one per running sequence) and local prefill chunks. Must
	// exceed MaxBatch so that prefill always makes progress.
	MaxBatchTokens int
	// ReserveTTL is how long a reservation waits for its Generate call
	// before its blocks are released. > 0.
	ReserveTTL time.Duration
}

// DefaultOptions returns the defaults of the decode-worker flags.
func DefaultOptions() Options {
	return Options{
		KVBlocks:       4096,
		BlockTokens:    16,
		MaxBatch:       64,
		ChunkTokens:    512,
		MaxBatchTokens: 2048,
		ReserveTTL:     30 * time.Second,
	}
}

// AddFlags registers --kv-blocks, --block-tokens, --max-batch,
// --chunk-tokens, --max-batch-tokens and --reserve-ttl on fs, with o's
// values as defaults.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.KVBlocks, "kv-blocks", o.KVBlocks, "KV blocks in the worker's pool")
	fs.IntVar(&o.BlockTokens, "block-tokens", o.BlockTokens, "tokens per KV block")
	fs.IntVar(&o.MaxBatch, "max-batch", o.MaxBatch, "most sequences in one step (running decodes plus local prefills)")
	fs.IntVar(&o.ChunkTokens, "chunk-tokens", o.ChunkTokens, "most tokens of one sequence's local prefill chunk in one step")
	fs.IntVar(&o.MaxBatchTokens, "max-batch-tokens", o.MaxBatchTokens, "token budget of one step, shared by decode tokens and local prefill chunks (> --max-batch)")
	fs.DurationVar(&o.ReserveTTL, "reserve-ttl", o.ReserveTTL, "how long a reservation waits for its Generate call before its blocks are released")
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
	if o.ChunkTokens <= 0 {
		errs = append(errs, fmt.Errorf("chunk-tokens %d must be positive", o.ChunkTokens))
	}
	if o.MaxBatchTokens <= o.MaxBatch {
		errs = append(errs, fmt.Errorf("max-batch-tokens %d must exceed max-batch %d", o.MaxBatchTokens, o.MaxBatch))
	}
	if o.ReserveTTL <= 0 {
		errs = append(errs, fmt.Errorf("reserve-ttl %v must be positive", o.ReserveTTL))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("decode: invalid options: %w", err)
	}
	return nil
}
