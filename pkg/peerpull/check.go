package peerpull

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
)

// DefaultCheckBlocks is the default Check.Blocks (--peer-pull-verify-blocks):
// the pulled chain's last block, recomputed from the blocks before it,
// which a corruption of any earlier block's KV below the last layer
// changes too (see docs/security.md for the figures behind the choice).
const DefaultCheckBlocks = 1

// Check is a worker's spot check of the KV it pulls from peers: Blocks
// blocks of each pull are recomputed here, on the worker's engine, from
// the pulled KV before them, and compared with what the peer sent
// (Verify). A pull that does not match is dropped, its prompt computed
// here, and its peer no longer pulled from (Trust).
type Check struct {
	// Blocks is how many blocks of each pull are recomputed: the last
	// block of the pulled chain, then blocks drawn uniformly from the
	// others. 0: no check; pulled KV then serves its own request only
	// and is never cached, exported or advertised.
	Blocks int
	// Engine is the worker's engine, used under Lock.
	Engine engine.Engine
	// Lock takes the worker's engine lock and returns the function that
	// releases it.
	Lock func() func()
	// IntN draws the sampled blocks (nil: math/rand/v2's IntN).
	IntN func(n int) int
}

// On reports whether pulls are checked.
func (c *Check) On() bool { return c != nil && c.Blocks > 0 && c.Engine != nil && c.Lock != nil }

// SampleBlocks returns min(k, n) distinct block indices in [0, n), in
// ascending order: n−1 (the last block) always, the others drawn
// uniformly from [0, n−1) with intn (nil: math/rand/v2's IntN).
func SampleBlocks(n, k int, intn func(int) int) []int {
	if n <= 0 || k <= 0 {
		return nil
	}
	if intn == nil {
		intn = rand.IntN
	}
	k = min(k, n)
	rest := make([]int, n-1)
	for i := range rest {
		rest[i] = i
	}
	out := []int{n - 1}
	// A partial Fisher–Yates shuffle draws k−1 of the rest.
	for i := range k - 1 {
		j := i + intn(len(rest)-i)
		rest[i], rest[j] = rest[j], rest[i]
		out = append(out, rest[i])
	}
	slices.Sort(out)
	return out
}

// scratchSeqs numbers the engine sequences of spot checks, far above the
// sequences a worker's scheduler numbers from 1.
var scratchSeqs atomic.Uint64

func scratchSeq() engine.SeqID { return engine.SeqID(1<<62 + scratchSeqs.Add(1)) }

// Verify recomputes blocks (indices of blockTokens-token blocks, each
// ending within n) of a pulled prefix on eng and reports whether each
// matches what was pulled, within the tolerance of eng's KV dtype
// (Match). layers holds per layer the canonical KV of the prompt's first
// n tokens as pulled; tokens is the prompt (at least n tokens). Block j
// is recomputed from the pulled KV of tokens [0, j × blockTokens),
// imported into a scratch sequence, with the engine's own prefill of its
// tokens: so a block whose KV a peer changed, and any block after a
// block whose KV it changed below the last layer, differs. All blocks
// run as one prefill batch under lock (the worker's engine lock), and
// the scratch sequences are freed before it is released. It returns the
// tokens recomputed. Errors: the engine's (the caller then treats the
// pull as failed, not as poisoned), or a block outside the prefix.
func Verify(ctx context.Context, eng engine.Engine, lock func() func(), tokens []int32, layers [][]byte, n, blockTokens int, blocks []int) (bool, int, error) {
	spec := eng.Spec()
	if len(layers) != spec.Layers || n <= 0 || n > len(tokens) {
		return false, 0, fmt.Errorf("peerpull: spot check of %d tokens in %d layers, for a model of %d layers and a prompt of %d tokens", n, len(layers), spec.Layers, len(tokens))
	}
	for _, l := range layers {
		if len(l) == 0 || len(l)%(2*n) != 0 {
			return false, 0, fmt.Errorf("peerpull: spot check: a layer of %d bytes is not %d tokens' KV", len(l), n)
		}
	}
	items := make([]engine.PrefillItem, 0, len(blocks))
	bySeq := make(map[engine.SeqID]int, len(blocks))
	unlock := lock()
	defer unlock()
	defer func() {
		for _, it := range items {
			eng.Free(it.Seq)
		}
	}()
	for _, j := range blocks {
		start, end := j*blockTokens, (j+1)*blockTokens
		if j < 0 || end > n {
			return false, 0, fmt.Errorf("peerpull: spot check of block %d outside the %d pulled tokens", j, n)
		}
		seq := scratchSeq()
		items = append(items, engine.PrefillItem{Seq: seq, Tokens: tokens[start:end]})
		bySeq[seq] = start
		if start == 0 {
			continue
		}
		var buf []byte
		for l, data := range layers {
			buf = rows(buf[:0], data, n, 0, start)
			if err := eng.ImportKV(seq, l, 0, buf); err != nil {
				return false, 0, fmt.Errorf("peerpull: spot check: import of layer %d: %w", l, err)
			}
		}
	}
	ok := true
	var want []byte
	_, err := eng.Prefill(ctx, items, func(c engine.KVChunk) error {
		if _, known := bySeq[c.Seq]; !known || c.Layer < 0 || c.Layer >= len(layers) || c.Start < 0 || c.End > n || c.Start >= c.End {
			return fmt.Errorf("peerpull: spot check: kv chunk of seq %d layer %d [%d, %d) not asked for", c.Seq, c.Layer, c.Start, c.End)
		}
		want = rows(want[:0], layers[c.Layer], n, c.Start, c.End)
		if !Match(spec.KVDType, want, c.Data) {
			ok = false
		}
		return nil
	})
	if err != nil {
		return false, 0, fmt.Errorf("peerpull: spot check: prefill: %w", err)
	}
	return ok, len(items) * blockTokens, nil
}

// rows appends to dst the rows of tokens [s, e) of one layer's canonical
// KV of n tokens (all K rows, then all V rows): K rows, then V rows.
func rows(dst, data []byte, n, s, e int) []byte {
	row := len(data) / (2 * n)
	dst = append(dst, data[s*row:e*row]...)
	return append(dst, data[(n+s)*row:(n+e)*row]...)
}

// f16Tolerance bounds the difference Match allows between two f16 KV
// values a and b: |a−b| ≤ f16Tolerance × max(|a|, |b|) + f16Floor.
// llama.cpp's kernels (CUDA above all) are not batch-invariant: the same
// tokens in another batch shape sum in another order, and f16 storage
// rounds at 2⁻¹¹; a few units in the last place of agreement is honest,
// a peer's substituted values (another prompt's KV, noise) differ by the
// values' own size.
const (
	f16Tolerance = 1.0 / 32
	f16Floor     = 1.0 / 256
)

// Match reports whether got, KV recomputed here, matches want, KV a peer
// sent, for KV of dtype dt: bf16 (the ref engine, whose KV does not
// depend on the batch or the chunking, bit for bit between workers built
// alike; the sim engine, whose KV is a function of the tokens) must be
// equal byte for byte; f16 (llama.cpp) within f16Tolerance of each
// value; q8_0 byte for byte.
func Match(dt engine.DType, want, got []byte) bool {
	if len(want) != len(got) {
		return false
	}
	if dt != engine.F16 {
		return bytes.Equal(want, got)
	}
	for i := 0; i+1 < len(want); i += 2 {
		a := halfToFloat(binary.LittleEndian.Uint16(want[i:]))
		b := halfToFloat(binary.LittleEndian.Uint16(got[i:]))
		if a == b {
			continue
		}
		if math.IsNaN(a) || math.IsNaN(b) || math.Abs(a-b) > f16Tolerance*max(math.Abs(a), math.Abs(b))+f16Floor {
			return false
		}
	}
	return true
}

// halfToFloat decodes an IEEE 754 half-precision value.
func halfToFloat(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	frac := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * math.Ldexp(frac, -24)
	case 0x1f:
		if frac == 0 {
			return sign * math.Inf(1)
		}
		return math.NaN()
	}
	return sign * math.Ldexp(1+frac/1024, exp-15)
}

// Trust is the set of peers a worker stopped pulling from: each failed a
// spot check. Safe for concurrent use; the zero Trust trusts every peer.
type Trust struct {
	mu  sync.Mutex
	bad map[string]time.Time
}

// Distrust marks peer untrusted from now on and reports whether it was
// trusted until now.
func (t *Trust) Distrust(peer string, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.bad[peer]; ok {
		return false
	}
	if t.bad == nil {
		t.bad = make(map[string]time.Time)
	}
	t.bad[peer] = now
	return true
}

// Trusted reports whether the worker pulls from peer.
func (t *Trust) Trusted(peer string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, bad := t.bad[peer]
	return !bad
}

// Untrusted returns how many peers failed a spot check.
func (t *Trust) Untrusted() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.bad)
}

// errPoisoned is the failure of a pull whose spot check did not match.
var errPoisoned = errors.New("the pulled KV does not match the blocks recomputed here")
