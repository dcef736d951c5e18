package planner

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Codec is what the planner needs to know of a KV wire codec (package
// kv/codec): how much it shrinks KV and how fast one core codes it.
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

const (
	mbps        = 1e6
	srcMeasured = "pkg/kv/codec BenchmarkCodecGaussian (Gaussian bf16, 2.5 MiB, per-core CPU-time MB/s), one noisy run on a shared 2-core machine"
	srcLossy    = "ratio exact: 1 byte per value + a float32 scale per 64 values = 2/(1+4/64); speeds from " + srcMeasured
	srcGeneral  = "ratio and speeds on real bf16 tensors from public figures (klauspost/compress, ZipNN) in the project's perf-profiles README; on synthetic Gaussian bf16 the project's zstd and s2 codecs measure 1.0×"
)

// codecs are the codecs of package kv/codec as the planner models them.
var codecs = []Codec{
	{Name: "none", Ratio: 1, Lossless: true, Source: "no coding"},
	{Name: "s2", Ratio: 1.0, EncodeBytesPerSec: 1000 * mbps, DecodeBytesPerSec: 2000 * mbps, Lossless: true, Source: srcGeneral},
	{Name: "zstd", Ratio: 1.27, EncodeBytesPerSec: 780 * mbps, DecodeBytesPerSec: 1000 * mbps, Lossless: true, Source: srcGeneral},
	{Name: "bf16", Ratio: 1.46, EncodeBytesPerSec: 760 * mbps, DecodeBytesPerSec: 1180 * mbps, Lossless: true, Source: "ratio and speeds from " + srcMeasured},
	{Name: "fp8", Ratio: 2 / (1 + 4.0/64), EncodeBytesPerSec: 300 * mbps, DecodeBytesPerSec: 930 * mbps, Source: srcLossy},
	{Name: "int8", Ratio: 2 / (1 + 4.0/64), EncodeBytesPerSec: 390 * mbps, DecodeBytesPerSec: 900 * mbps, Source: srcLossy},
}

// CodecNames returns the names CodecByName knows, in a fixed order.
func CodecNames() []string {
	names := make([]string, len(codecs))
	for i, c := range codecs {
		names[i] = c.Name
	}
	return names
}

// CodecByName returns the model of the codec called name. Errors:
// ErrUnknownCodec.
func CodecByName(name string) (Codec, error) {
	i := slices.IndexFunc(codecs, func(c Codec) bool { return c.Name == name })
	if i < 0 {
		return Codec{}, fmt.Errorf("%w %q (want one of %s)", ErrUnknownCodec, name, strings.Join(CodecNames(), ", "))
	}
	return codecs[i], nil
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
