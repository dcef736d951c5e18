package codecpick_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/kv/codec"
	"github.com/pdserve/pdserve/pkg/kvtransfer/codecpick"
)

const (
	mb   = 1e6
	gbps = 1e9 / 8 // bytes/s of one Gb/s
)

// table are per-core figures of the order the project's benchmarks
// measure (raw MB/s): what matters is their order, not their values.
func table() []codecpick.Candidate {
	return []codecpick.Candidate{
		{Name: "none", Lossless: true, Ratio: 1, EncodeBytesPerSec: 10000 * mb, DecodeBytesPerSec: 10000 * mb},
		{Name: "s2", Lossless: true, Ratio: 1.0, EncodeBytesPerSec: 3000 * mb, DecodeBytesPerSec: 3000 * mb},
		{Name: "zstd", Lossless: true, Ratio: 1.05, EncodeBytesPerSec: 780 * mb, DecodeBytesPerSec: 1000 * mb},
		{Name: "bf16", Lossless: true, Ratio: 1.46, EncodeBytesPerSec: 760 * mb, DecodeBytesPerSec: 1180 * mb},
		{Name: "fp8", Ratio: 1.88, EncodeBytesPerSec: 300 * mb, DecodeBytesPerSec: 930 * mb},
		{Name: "int8", Ratio: 1.88, EncodeBytesPerSec: 390 * mb, DecodeBytesPerSec: 900 * mb},
	}
}

func TestPick(t *testing.T) {
	slowDecoder := table()
	slowDecoder[3].DecodeBytesPerSec = 50 * mb // bf16 on a receiver that decodes it slowly
	unknownDecoder := table()
	for i := range unknownDecoder {
		unknownDecoder[i].DecodeBytesPerSec = 0
	}
	noEncode := table()
	noEncode[3].EncodeBytesPerSec = 0
	for _, tc := range []struct {
		name       string
		in         codecpick.Input
		want       string
		wantBound  codecpick.Bound
		wantLink   float64
		wantReason string
	}{
		{
			name: "fast link: none",
			in:   codecpick.Input{RawBytes: 100 * mb, LinkBytesPerSec: 50 * gbps, EncodeCores: 1, DecodeCores: 1, Candidates: table()},
			want: "none", wantBound: codecpick.BoundLink, wantLink: 50 * gbps, wantReason: "measured",
		},
		{
			name: "slow link: the best-ratio lossless codec",
			in:   codecpick.Input{RawBytes: 100 * mb, LinkBytesPerSec: 1 * gbps, EncodeCores: 1, DecodeCores: 1, Candidates: table()},
			want: "bf16", wantBound: codecpick.BoundLink, wantLink: 1 * gbps,
		},
		{
			name: "slow link, lossy allowed: a lossy codec",
			in:   codecpick.Input{RawBytes: 100 * mb, LinkBytesPerSec: 1 * gbps, EncodeCores: 1, DecodeCores: 1, AllowLossy: true, Candidates: table()},
			want: "fp8", wantBound: codecpick.BoundLink, wantLink: 1 * gbps, // fp8 and int8 tie on the link; fp8 is listed first
		},
		{
			name: "fast link, lossy allowed: still none",
			in:   codecpick.Input{RawBytes: 100 * mb, LinkBytesPerSec: 50 * gbps, EncodeCores: 1, DecodeCores: 1, AllowLossy: true, Candidates: table()},
			want: "none", wantBound: codecpick.BoundLink, wantLink: 50 * gbps,
		},
		{
			name: "CPU-bound sender: none",
			in:   codecpick.Input{RawBytes: 100 * mb, LinkBytesPerSec: 1 * gbps, EncodeCores: 0.1, DecodeCores: 1, Candidates: table()},
			want: "none", wantBound: codecpick.BoundLink, wantLink: 1 * gbps,
		},
		{
			name: "more encode cores make compression pay on a middling link",
			in:   codecpick.Input{RawBytes: 100 * mb, LinkBytesPerSec: 10 * gbps, EncodeCores: 4, DecodeCores: 4, Candidates: table()},
			want: "bf16", wantBound: codecpick.BoundLink, wantLink: 10 * gbps,
		},
		{
			name: "slow receiver decode: not bf16",
			in:   codecpick.Input{RawBytes: 100 * mb, LinkBytesPerSec: 1 * gbps, EncodeCores: 1, DecodeCores: 1, Candidates: slowDecoder},
			want: "zstd", wantBound: codecpick.BoundLink, wantLink: 1 * gbps,
		},
		{
			name: "unknown receiver decode does not limit",
			in:   codecpick.Input{RawBytes: 100 * mb, LinkBytesPerSec: 1 * gbps, EncodeCores: 1, DecodeCores: 1, Candidates: unknownDecoder},
			want: "bf16", wantBound: codecpick.BoundLink, wantLink: 1 * gbps,
		},
		{
			name: "no encode speed: not picked",
			in:   codecpick.Input{RawBytes: 100 * mb, LinkBytesPerSec: 1 * gbps, EncodeCores: 1, DecodeCores: 1, Candidates: noEncode},
			want: "zstd", wantBound: codecpick.BoundLink, wantLink: 1 * gbps,
		},
		{
			name: "no link measurement: the default link, 10 Gb/s",
			in:   codecpick.Input{RawBytes: 100 * mb, EncodeCores: 1, DecodeCores: 1, Candidates: table()},
			want: "none", wantBound: codecpick.BoundLink, wantLink: codecpick.DefaultLinkBytesPerSec, wantReason: "assumed",
		},
		{
			name: "no link measurement, four cores: what 10 Gb/s favours",
			in:   codecpick.Input{RawBytes: 100 * mb, LinkBytesPerSec: -1, EncodeCores: 4, DecodeCores: 4, Candidates: table()},
			want: "bf16", wantBound: codecpick.BoundLink, wantLink: codecpick.DefaultLinkBytesPerSec, wantReason: "assumed",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch, err := codecpick.Pick(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if ch.Codec != tc.want {
				t.Errorf("picked %s, want %s (%s)", ch.Codec, tc.want, ch.Reason)
			}
			if ch.LinkBytesPerSec != tc.wantLink {
				t.Errorf("link %v, want %v", ch.LinkBytesPerSec, tc.wantLink)
			}
			if len(ch.Predictions) != len(tc.in.Candidates) {
				t.Fatalf("%d predictions for %d candidates", len(ch.Predictions), len(tc.in.Candidates))
			}
			raw := float64(tc.in.RawBytes)
			for i, p := range ch.Predictions {
				c := tc.in.Candidates[i]
				if p.Codec != c.Name {
					t.Errorf("prediction %d is of %s, want %s", i, p.Codec, c.Name)
				}
				if p.Skipped != "" {
					if !math.IsInf(p.Seconds, 1) || p.Bound != "" {
						t.Errorf("%s skipped (%s) with %v s, bound %q", c.Name, p.Skipped, p.Seconds, p.Bound)
					}
					continue
				}
				// The model: the slowest of encode, link and decode.
				want := max(raw/(c.EncodeBytesPerSec*tc.in.EncodeCores), raw/(c.Ratio*ch.LinkBytesPerSec))
				if c.DecodeBytesPerSec > 0 {
					want = max(want, raw/(c.DecodeBytesPerSec*tc.in.DecodeCores))
				}
				if math.Abs(p.Seconds-want) > 1e-12*want {
					t.Errorf("%s: %v s, want %v", c.Name, p.Seconds, want)
				}
				if p.Seconds < ch.Seconds {
					t.Errorf("%s (%v s) beats the choice %s (%v s)", c.Name, p.Seconds, ch.Codec, ch.Seconds)
				}
				if c.Name == ch.Codec && (p.Seconds != ch.Seconds || p.Bound != tc.wantBound) {
					t.Errorf("choice %s: %v s %s-bound, Choice says %v s, want %s-bound", c.Name, p.Seconds, p.Bound, ch.Seconds, tc.wantBound)
				}
				if !c.Lossless && !tc.in.AllowLossy {
					t.Errorf("lossy %s considered without AllowLossy", c.Name)
				}
			}
			if !strings.HasPrefix(ch.Reason, ch.Codec+" ") || !strings.Contains(ch.Reason, tc.wantReason) {
				t.Errorf("reason %q: want it to start with %q and say %q", ch.Reason, ch.Codec, tc.wantReason)
			}
		})
	}
}

func TestPickErrors(t *testing.T) {
	lossy := []codecpick.Candidate{table()[4], table()[5]}
	for _, tc := range []struct {
		name string
		in   codecpick.Input
		want error
	}{
		{"no candidates", codecpick.Input{RawBytes: 1, EncodeCores: 1, DecodeCores: 1}, codecpick.ErrNoCandidate},
		{"only lossy, not allowed", codecpick.Input{RawBytes: 1, EncodeCores: 1, DecodeCores: 1, Candidates: lossy}, codecpick.ErrNoCandidate},
		{"no raw bytes", codecpick.Input{EncodeCores: 1, DecodeCores: 1, Candidates: table()}, codecpick.ErrBadInput},
		{"no cores", codecpick.Input{RawBytes: 1, DecodeCores: 1, Candidates: table()}, codecpick.ErrBadInput},
		{"NaN link", codecpick.Input{RawBytes: 1, LinkBytesPerSec: math.NaN(), EncodeCores: 1, DecodeCores: 1, Candidates: table()}, codecpick.ErrBadInput},
		{"zero ratio", codecpick.Input{RawBytes: 1, EncodeCores: 1, DecodeCores: 1, Candidates: []codecpick.Candidate{{Name: "none", Lossless: true, EncodeBytesPerSec: 1}}}, codecpick.ErrBadInput},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := codecpick.Pick(tc.in); !errors.Is(err, tc.want) {
				t.Errorf("Pick: %v, want %v", err, tc.want)
			}
		})
	}
}

func TestCandidates(t *testing.T) {
	local := codec.Speeds{Codecs: []codec.Speed{
		{Codec: "none", Lossless: true, EncodeBytesPerSec: 9, DecodeBytesPerSec: 8, Ratio: 1},
		{Codec: "fp8", EncodeBytesPerSec: 3, DecodeBytesPerSec: 2, Ratio: 1.88},
	}}
	got := codecpick.Candidates(local, map[string]float64{"fp8": 5})
	want := []codecpick.Candidate{
		{Name: "none", Lossless: true, Ratio: 1, EncodeBytesPerSec: 9},
		{Name: "fp8", Ratio: 1.88, EncodeBytesPerSec: 3, DecodeBytesPerSec: 5},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Candidates (-want +got):\n%s", diff)
	}
}
