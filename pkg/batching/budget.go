package batching

import (
	"errors"
	"flag"
	"fmt"

	"go.uber.org/zap"
)

// Budget is the token budget of one step of a worker's batch loop.
type Budget struct {
	// ChunkTokens caps the prompt tokens one sequence contributes to one
	// step (chunked prefill). > 0.
	ChunkTokens int
	// MaxBatchTokens is the token budget of one step, summed over the
	// batch: prompt chunks and, on decode workers, one token per running
	// sequence. > 0; each worker bounds it further (prefill: ≥
	// ChunkTokens; decode: > MaxBatch).
	MaxBatchTokens int
}

// Defaults of --chunk-tokens and --max-batch-tokens: Sarathi-style chunks,
// four to a step.
const (
	DefaultChunkTokens    = 512
	DefaultMaxBatchTokens = 2048
)

// DefaultBudget returns the flags' defaults.
func DefaultBudget() Budget {
	return Budget{ChunkTokens: DefaultChunkTokens, MaxBatchTokens: DefaultMaxBatchTokens}
}

// AddFlags registers --chunk-tokens and --max-batch-tokens on fs, with
// b's values as defaults.
func (b *Budget) AddFlags(fs *flag.FlagSet) {
	fs.IntVar(&b.ChunkTokens, "chunk-tokens", b.ChunkTokens,
		"most prompt tokens of one sequence prefilled in one step (chunked prefill; on decode workers, of a local prefill)")
	fs.IntVar(&b.MaxBatchTokens, "max-batch-tokens", b.MaxBatchTokens,
		"token budget of one step, summed over the batch: prompt chunks and, on decode workers, one token per running sequence (prefill workers: >= --chunk-tokens; decode workers: > --max-batch)")
}

// Validate reports each field that is not positive, naming its flag, in
// one error (nil when both are).
func (b Budget) Validate() error {
	var errs []error
	if b.ChunkTokens <= 0 {
		errs = append(errs, fmt.Errorf("chunk-tokens %d must be positive", b.ChunkTokens))
	}
	if b.MaxBatchTokens <= 0 {
		errs = append(errs, fmt.Errorf("max-batch-tokens %d must be positive", b.MaxBatchTokens))
	}
	return errors.Join(errs...)
}

// LogFields returns the settings as zap fields named after their flags:
// chunk_tokens, max_batch_tokens.
func (b Budget) LogFields() []zap.Field {
	return []zap.Field{zap.Int("chunk_tokens", b.ChunkTokens), zap.Int("max_batch_tokens", b.MaxBatchTokens)}
}
