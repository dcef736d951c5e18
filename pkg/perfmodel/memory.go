package perfmodel

import (
	"math"
	"time"
)

// KVBytesPerToken is the KV size of one token over all layers and all
// GPUs: the measured KVBytes when the profile has it, else the model's
// bf16 size 2 × layers × KV heads × head dim × 2 bytes.
func (p *Profile) KVBytesPerToken() int64 {
	if p.KVBytes > 0 {
		return p.KVBytes
	}
	return p.Spec.KVBytesPerToken()
}

// kvBytesPerTokenPerGPU is one GPU's share of a token's KV. When the model
// has fewer KV heads than GPUs, heads are replicated, so the share does not
// shrink below one head.
func (p *Profile) kvBytesPerTokenPerGPU() float64 {
	m := p.Spec
	kvHeads := math.Ceil(float64(m.KVHeads) / float64(p.TP))
	return float64(p.KVBytesPerToken()) / float64(m.KVHeads) * kvHeads
}

// WeightBytesPerGPU is the bf16 weight memory one GPU of the group holds,
// bytes (the whole model's weights ÷ TP, embeddings included).
func (p *Profile) WeightBytesPerGPU() float64 { return 2 * p.Spec.Params / float64(p.TP) }

// KVCapacityBytes is the memory left for the KV pool over the worker's TP
// GPUs: per GPU, capacity × utilization − weights − reserve; 0 when the
// model does not fit.
func (p *Profile) KVCapacityBytes() float64 {
	perGPU := p.Hardware.MemoryBytes*p.Memory.Utilization - p.WeightBytesPerGPU() - p.Memory.ReserveBytesPerGPU
	return max(perGPU, 0) * float64(p.TP)
}

// MaxKVTokens is how many tokens of KV one worker (TP GPUs) can hold, the
// size of a decode worker's pool: Memory.MaxKVTokens when set, else
// derived from the memory left beside the weights.
func (p *Profile) MaxKVTokens() int64 {
	if p.Memory.MaxKVTokens > 0 {
		return p.Memory.MaxKVTokens
	}
	perToken := p.kvBytesPerTokenPerGPU() * float64(p.TP)
	return int64(p.KVCapacityBytes() / perToken)
}

// MaxKVBlocks is MaxKVTokens in whole blocks of blockTokens tokens (0 for
// blockTokens ≤ 0).
func (p *Profile) MaxKVBlocks(blockTokens int) int64 {
	if blockTokens <= 0 {
		return 0
	}
	return p.MaxKVTokens() / int64(blockTokens)
}

// KVTransferTime is how long moving the true KV of tokens tokens takes over
// a link of linkBytesPerSec bytes/s (see TransferTime).
func (p *Profile) KVTransferTime(tokens int, linkBytesPerSec float64) time.Duration {
	return TransferTime(int64(tokens)*p.KVBytesPerToken(), linkBytesPerSec)
}

// TransferTime is how long n bytes take over a link of bytesPerSec bytes/s,
// serialisation only (no latency), rounded to the nanosecond. It is 0 for
// n ≤ 0 and the largest Duration for a link of bandwidth ≤ 0.
func TransferTime(n int64, bytesPerSec float64) time.Duration {
	if n <= 0 {
		return 0
	}
	if !(bytesPerSec > 0) {
		return math.MaxInt64
	}
	return seconds(float64(n) / bytesPerSec)
}
