package codec_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// SelfBench measures every codec that takes the dtype, with positive
// finite speeds, and ratios that are those of encoding its sample. No
// timing is asserted: the machine is shared.
func TestSelfBench(t *testing.T) {
	for _, dt := range []engine.DType{engine.BF16, engine.F16, engine.Q8_0} {
		t.Run(dt.String(), func(t *testing.T) {
			s, err := codec.SelfBench(context.Background(), dt, 20*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if s.DType != dt || s.SampleBytes <= 0 || s.Elapsed <= 0 {
				t.Errorf("dtype %v, sample %d bytes, elapsed %v", s.DType, s.SampleBytes, s.Elapsed)
			}
			raw, err := codec.SampleKV(dt, codec.BenchSampleBytes, 1)
			if err != nil {
				t.Fatal(err)
			}
			if len(raw) != s.SampleBytes {
				t.Errorf("sample %d bytes, SelfBench says %d", len(raw), s.SampleBytes)
			}
			var want, got []string
			for _, c := range codec.All() {
				if c.Supports(dt) == nil {
					want = append(want, c.Name())
				}
			}
			for _, sp := range s.Codecs {
				got = append(got, sp.Codec)
				c, err := codec.ByName(sp.Codec)
				if err != nil {
					t.Fatal(err)
				}
				for what, v := range map[string]float64{"encode": sp.EncodeBytesPerSec, "decode": sp.DecodeBytesPerSec} {
					if !(v > 0) || math.IsInf(v, 0) {
						t.Errorf("%s: %s speed %v, want positive and finite", sp.Codec, what, v)
					}
				}
				enc, err := c.Encode(nil, raw, dt)
				if err != nil {
					t.Fatal(err)
				}
				if r := float64(len(raw)) / float64(len(enc)); sp.Ratio != r {
					t.Errorf("%s: ratio %v, encoding the sample gives %v", sp.Codec, sp.Ratio, r)
				}
				if sp.Lossless != c.Lossless() {
					t.Errorf("%s: lossless %v, codec says %v", sp.Codec, sp.Lossless, c.Lossless())
				}
				if g, ok := s.Get(sp.Codec); !ok || g != sp {
					t.Errorf("Get(%s) = %+v, %v", sp.Codec, g, ok)
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("codecs (-want +got):\n%s", diff)
			}
			if sp, ok := s.Get("none"); !ok || sp.Ratio != 1 {
				t.Errorf("none: %+v, %v; want ratio 1", sp, ok)
			}
			if dt.Float() {
				// The sample is KV-shaped: the byte-plane codec finds the
				// exponents' few bits, which random bytes would not have.
				if sp, ok := s.Get("f16"); !ok || sp.Ratio < 1.1 {
					t.Errorf("bf16 codec on %v: %+v, %v; want ratio ≥ 1.1", dt, sp, ok)
				}
			} else if _, ok := s.Get("bf16"); ok {
				t.Errorf("bf16 codec measured on %v KV", dt)
			}
		})
	}
}

func TestSelfBenchErrors(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := codec.SelfBench(ctx, engine.BF16, time.Millisecond); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v, want context.Canceled", err)
	}
	if _, err := codec.SelfBench(context.Background(), engine.DType(200), time.Millisecond); !errors.Is(err, codec.ErrDType) {
		t.Errorf("unknown dtype: %v, want ErrDType", err)
	}
	if _, ok := (codec.Speeds{}).Get("lz4"); ok {
		t.Error("Get(lz4) found a codec")
	}
}

// BenchmarkSelfBench runs the start-up self-benchmark once per op and
// reports its figures, for the record of a machine.
func BenchmarkSelfBench(b *testing.B) {
	var s codec.Speeds
	for b.Loop() {
		var err error
		if s, err = codec.SelfBench(context.Background(), engine.BF16, 0); err != nil {
			b.Fatal(err)
		}
	}
	for _, sp := range s.Codecs {
		b.ReportMetric(sp.EncodeBytesPerSec/1e6, sp.Codec+"-enc-MB/s")
		b.ReportMetric(sp.DecodeBytesPerSec/1e6, sp.Codec+"-dec-MB/s")
		b.ReportMetric(sp.Ratio, sp.Codec+"-ratio")
	}
}
