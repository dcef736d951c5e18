package planner

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
	"github.com/pdserve/pdserve/pkg/kvtransfer/codecpick"
)

// Codec is what the planner needs to know of a KV wire codec (package
// kv/codec): how much it shrinks KV and how fast one core codes it.
// CodecByName and MeasureCodecs fill it from a self-benchmark on the
// planner's machine, not a table; their ratios are on synthetic KV, which
// differs from real KV (see MeasureCodecs).
type Codec struct {
	Name string `json:"name"`
	// Ratio is raw bytes over wire bytes, > 0.
	Ratio float64 `json:"ratio"`
	// EncodeBytesPerSec and DecodeBytesPerSec are raw bytes/s one core
	// encodes and decodes; 0 means the codec never limits the transfer.
	EncodeBytesPerSec float64 `json:"encode_bytes_per_s_per_core"`
	DecodeBytesPerSec float64 `json:"decode_bytes_per_s_per_core"`
	Lossless          bool    `json:"lossless"`
	// Source says where the figures come from.
	Source string `json:"source"`
}

// ErrUnknownCodec is returned by CodecByName; match with errors.Is.
var ErrUnknownCodec = errors.New("planner: unknown codec")

// benchSource is the Source of the codecs MeasureCodecs returns.
const benchSource = "self-benchmark on the planner's machine (pkg/kv/codec SelfBench: synthetic Gaussian bf16 KV, per-core CPU time); " +
	"ratios on synthetic KV differ from real KV (s2 and zstd find runs in real tensors that random values lack; override with a measured ratio)"

// MeasureCodecs runs the codec self-benchmark (codec.SelfBench) on bf16
// KV on the calling goroutine, within about budget (≤ 0:
// codec.DefaultBenchBudget), and returns every codec of package kv/codec
// with its ratio and per-core speeds as measured on this machine, in the
// order of CodecNames. The ratios are on the benchmark's synthetic KV, not
// on real KV: s2 and zstd measure about 1.0× on it and more on real
// tensors, the byte-plane codec a little more on real KV; the lossy
// codecs' ratios are exact by their format. Callers that know a real
// ratio override Codec.Ratio (the planner CLI's --codec-ratio). Errors:
// SelfBench's, wrapped.
func MeasureCodecs(ctx context.Context, budget time.Duration) ([]Codec, error) {
	sp, err := codec.SelfBench(ctx, engine.BF16, budget)
	if err != nil {
		return nil, fmt.Errorf("planner: codec speeds: %w", err)
	}
	out := make([]Codec, 0, len(sp.Codecs))
	for _, c := range sp.Codecs {
		out = append(out, Codec{
			Name: c.Codec, Ratio: c.Ratio, Lossless: c.Lossless,
			EncodeBytesPerSec: c.EncodeBytesPerSec, DecodeBytesPerSec: c.DecodeBytesPerSec,
			Source: benchSource,
		})
	}
	return out, nil
}

// measured is MeasureCodecs with the default budget, run once per process
// (at the first plan that asks for a codec).
var measured = sync.OnceValues(func() ([]Codec, error) {
	return MeasureCodecs(context.Background(), codec.DefaultBenchBudget)
})

// CodecNames returns the names CodecByName knows (package kv/codec's), in
// a fixed order.
func CodecNames() []string { return codec.Names() }

// CodecByName returns the model of the codec called name, with the speeds
// and ratio the self-benchmark measured on this machine (MeasureCodecs;
// the first call runs it, later calls reuse its figures). Errors:
// ErrUnknownCodec, or the benchmark's error.
func CodecByName(name string) (Codec, error) {
	if !slices.Contains(CodecNames(), name) {
		return Codec{}, fmt.Errorf("%w %q (want one of %s)", ErrUnknownCodec, name, strings.Join(CodecNames(), ", "))
	}
	cs, err := measured()
	if err != nil {
		return Codec{}, err
	}
	i := slices.IndexFunc(cs, func(c Codec) bool { return c.Name == name })
	if i < 0 {
		return Codec{}, fmt.Errorf("%w %q: not measured on bf16", ErrUnknownCodec, name)
	}
	return cs[i], nil
}

// CodecFor returns the codec model the planner uses for the codec named
// name: CodecByName's, or, for codecpick.Auto and codecpick.AutoLossy
// (the prefill workers choose per transfer), the codec codecpick.Pick
// chooses among the measured ones for a link of linkBytesPerSec with
// cores coding at each end, as a worker whose link measured that would.
// Errors: CodecByName's, or ErrUnknownCodec when no codec can be chosen.
func CodecFor(name string, linkBytesPerSec float64, cores int) (Codec, error) {
	auto, lossy := codecpick.AutoName(name)
	if !auto {
		return CodecByName(name)
	}
	cs, err := measured()
	if err != nil {
		return Codec{}, err
	}
	cands := make([]codecpick.Candidate, len(cs))
	for i, c := range cs {
		cands[i] = codecpick.Candidate{Name: c.Name, Lossless: c.Lossless, Ratio: c.Ratio, EncodeBytesPerSec: c.EncodeBytesPerSec, DecodeBytesPerSec: c.DecodeBytesPerSec}
	}
	// The choice does not depend on the bytes: every candidate's time is
	// proportional to them.
	ch, err := codecpick.Pick(codecpick.Input{RawBytes: 1 << 20, LinkBytesPerSec: linkBytesPerSec,
		EncodeCores: float64(max(cores, 1)), DecodeCores: float64(max(cores, 1)), AllowLossy: lossy, Candidates: cands})
	if err != nil {
		return Codec{}, fmt.Errorf("%w %q: %w", ErrUnknownCodec, name, err)
	}
	c := cs[slices.IndexFunc(cs, func(c Codec) bool { return c.Name == ch.Codec })]
	c.Source = fmt.Sprintf("%s's choice for a %.4g Gb/s link at %d cores: %s; %s", name, linkBytesPerSec*8/1e9, max(cores, 1), ch.Reason, c.Source)
	return c, nil
}

// validate reports a codec whose ratio or speeds are out of range.
func (c Codec) validate() error {
	if !(c.Ratio > 0) || math.IsInf(c.Ratio, 0) || !finiteNonNeg(c.EncodeBytesPerSec) || !finiteNonNeg(c.DecodeBytesPerSec) {
		return fmt.Errorf("planner: codec %q: ratio must be > 0 and speeds ≥ 0, finite", c.Name)
	}
	return nil
}

// rawRate is the raw KV bytes/s a transfer moves over a link of
// linkBytesPerSec with this codec on cores cores at each end: coding is
// pipelined with sending, so the slowest of link×ratio, encode and decode
// sets the pace.
func (c Codec) rawRate(linkBytesPerSec float64, cores int) float64 {
	r := linkBytesPerSec * c.Ratio
	if c.EncodeBytesPerSec > 0 {
		r = min(r, c.EncodeBytesPerSec*float64(cores))
	}
	if c.DecodeBytesPerSec > 0 {
		r = min(r, c.DecodeBytesPerSec*float64(cores))
	}
	return r
}
