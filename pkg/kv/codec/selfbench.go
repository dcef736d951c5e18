package codec

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
)

// DefaultBenchBudget is the time SelfBench spends when given none: short
// enough for a worker's start, long enough for a few hundred codings of
// the sample per codec on one core.
const DefaultBenchBudget = 200 * time.Millisecond

// BenchSampleBytes is the size of SelfBench's sample: a quarter of a
// default frame (pkg/kvtransfer), several of the bf16 codec's blocks.
const BenchSampleBytes = 256 << 10

// Speed is one codec's figures from SelfBench.
type Speed struct {
	Codec    string `json:"codec"` // Codec.Name
	Lossless bool   `json:"lossless"`
	// EncodeBytesPerSec and DecodeBytesPerSec are raw (canonical) bytes
	// per second that one core encodes and decodes; > 0 and finite.
	EncodeBytesPerSec float64 `json:"encode_bytes_per_s"`
	DecodeBytesPerSec float64 `json:"decode_bytes_per_s"`
	// Ratio is raw bytes over encoded bytes on the sample; > 0.
	Ratio float64 `json:"ratio"`
}

// Speeds is what SelfBench measured.
type Speeds struct {
	DType       engine.DType // the KV dtype of the sample
	SampleBytes int          // raw bytes of the sample
	// CPUTime is true when the speeds are over the benchmarking thread's
	// CPU time (Linux), so that time spent waiting for a core on a busy
	// machine does not count; false when they are over wall-clock time.
	CPUTime bool
	// Codecs are the codecs that take DType, in the order of All
	// (lossless first).
	Codecs []Speed
	// Elapsed is the wall-clock time the benchmark took.
	Elapsed time.Duration
}

// Get returns the figures of the codec called name (a name of Names or an
// alias), and whether SelfBench measured it.
func (s Speeds) Get(name string) (Speed, bool) {
	c, err := ByName(name)
	if err != nil {
		return Speed{}, false
	}
	for _, sp := range s.Codecs {
		if sp.Codec == c.Name() {
			return sp, true
		}
	}
	return Speed{}, false
}

// SelfBench times, on the calling goroutine (one core), the encoding and
// decoding of a KV-shaped sample of dtype dt (BenchSampleBytes) by every
// codec that takes dt, lossy ones included, within about budget of wall
// time in all (≤ 0: DefaultBenchBudget), split evenly over the codecs and
// their two directions. Each codec codes the sample at least once per
// direction after a first, untimed round trip, which gives its ratio and
// checks that it decodes (exactly, for a lossless codec); so on a very
// slow machine (or under the race detector) the benchmark can overrun
// budget by one coding per codec.
//
// The sample is synthetic (sampleKV): Gaussian values with a log-normal
// spread per channel, as attention K/V are, rounded to dt (and quantized
// to q8_0 blocks for Q8_0). Ratios on real KV differ from ratios on it,
// a little for the byte-plane codec (real KV compresses somewhat better)
// and much for s2 and zstd, which find runs in real tensors (padding,
// zeroed heads) that Gaussian values lack; speeds differ less.
//
// Errors: ErrDType for a dtype SelfBench has no sample of, ctx's error
// when it ends first, and a codec's error or a failed round trip (a bug),
// wrapped.
func SelfBench(ctx context.Context, dt engine.DType, budget time.Duration) (Speeds, error) {
	if budget <= 0 {
		budget = DefaultBenchBudget
	}
	raw, err := sampleKV(dt, BenchSampleBytes, 1)
	if err != nil {
		return Speeds{}, err
	}
	var cs []Codec
	for _, c := range All() {
		if c.Supports(dt) == nil {
			cs = append(cs, c)
		}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := time.Now()
	_, cpu := threadCPU()
	out := Speeds{DType: dt, SampleBytes: len(raw), CPUTime: cpu}
	share := budget / time.Duration(2*len(cs))
	var enc, dec []byte
	for _, c := range cs {
		if enc, err = c.Encode(enc[:0], raw, dt); err != nil {
			return Speeds{}, fmt.Errorf("codec: self-bench %s: encode: %w", c.Name(), err)
		}
		if dec, err = c.Decode(dec[:0], enc, len(raw), dt); err != nil {
			return Speeds{}, fmt.Errorf("codec: self-bench %s: decode: %w", c.Name(), err)
		}
		if len(dec) != len(raw) || (c.Lossless() && !bytes.Equal(dec, raw)) {
			return Speeds{}, fmt.Errorf("codec: self-bench %s: round trip of %d bytes gave %d different bytes", c.Name(), len(raw), len(dec))
		}
		sp := Speed{Codec: c.Name(), Lossless: c.Lossless(), Ratio: float64(len(raw)) / float64(len(enc))}
		var scratch []byte
		if sp.EncodeBytesPerSec, err = timeLoop(ctx, share, len(raw), func() error {
			var err error
			scratch, err = c.Encode(scratch[:0], raw, dt)
			return err
		}); err != nil {
			return Speeds{}, fmt.Errorf("codec: self-bench %s: encode: %w", c.Name(), err)
		}
		if sp.DecodeBytesPerSec, err = timeLoop(ctx, share, len(raw), func() error {
			var err error
			dec, err = c.Decode(dec[:0], enc, len(raw), dt)
			return err
		}); err != nil {
			return Speeds{}, fmt.Errorf("codec: self-bench %s: decode: %w", c.Name(), err)
		}
		out.Codecs = append(out.Codecs, sp)
	}
	out.Elapsed = time.Since(start)
	return out, nil
}

// timeLoop runs f until share of wall time passed (once at least) and
// returns n bytes per run over the thread's CPU time (wall time where
// that is not available). The caller holds its OS thread.
func timeLoop(ctx context.Context, share time.Duration, n int, f func() error) (float64, error) {
	wall0 := time.Now()
	cpu0, cpuOK := threadCPU()
	runs := 0
	for {
		if err := ctx.Err(); err != nil {
			return 0, context.Cause(ctx)
		}
		if err := f(); err != nil {
			return 0, err
		}
		runs++
		if time.Since(wall0) >= share {
			break
		}
	}
	el := time.Since(wall0)
	if cpuOK {
		if cpu1, ok := threadCPU(); ok && cpu1 > cpu0 {
			el = cpu1 - cpu0
		}
	}
	el = max(el, time.Nanosecond)
	return float64(runs) * float64(n) / el.Seconds(), nil
}

// sampleKV returns n bytes (rounded down to whole values or q8_0 blocks)
// of synthetic KV of dtype dt, deterministic in seed: rows of 128
// channels, each channel Gaussian with its own spread (log-normal, σ of
// the log 0.75), as K/V channels differ by orders of magnitude. Errors:
// ErrDType for a dtype it has no sample of.
func sampleKV(dt engine.DType, n int, seed uint64) ([]byte, error) {
	const width = 128
	r := rand.New(rand.NewPCG(seed, 0x6b76))
	sigma := make([]float64, width)
	for i := range sigma {
		sigma[i] = math.Exp(0.75 * r.NormFloat64())
	}
	value := func(i int) float32 { return float32(r.NormFloat64() * sigma[i%width]) }
	switch dt {
	case engine.BF16, engine.F16:
		out := make([]byte, n/2*2)
		for i := range n / 2 {
			x := value(i)
			h := f32ToBF16(x)
			if dt == engine.F16 {
				h = f32ToF16(x)
			}
			binary.LittleEndian.PutUint16(out[2*i:], h)
		}
		return out, nil
	case engine.Q8_0:
		// llama.cpp's q8_0: per block of 32 values an f16 scale
		// d = max|x|/127, then round(x/d) as int8.
		const block, blockBytes = 32, 2 + 32
		out := make([]byte, 0, n/blockBytes*blockBytes)
		var xs [block]float32
		for b := 0; b < n/blockBytes; b++ {
			m := float32(0)
			for j := range xs {
				xs[j] = value(b*block + j)
				m = max(m, float32(math.Abs(float64(xs[j]))))
			}
			d := m / 127
			out = binary.LittleEndian.AppendUint16(out, f32ToF16(d))
			for _, x := range xs {
				q := 0.0
				if d > 0 {
					q = math.RoundToEven(float64(x / d))
				}
				out = append(out, byte(int8(q)))
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("codec: self-bench: no sample of dtype %v: %w", dt, ErrDType)
}
