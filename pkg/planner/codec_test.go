package planner

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The planner's codec figures come from a self-benchmark on its machine:
// every codec, positive finite speeds, and a source that says so and
// warns that synthetic ratios are not real KV's.
func TestMeasureCodecs(t *testing.T) {
	cs, err := MeasureCodecs(context.Background(), 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cs {
		names = append(names, c.Name)
		if err := c.validate(); err != nil {
			t.Error(err)
		}
		for what, v := range map[string]float64{"encode": c.EncodeBytesPerSec, "decode": c.DecodeBytesPerSec, "ratio": c.Ratio} {
			if !(v > 0) || math.IsInf(v, 0) {
				t.Errorf("%s: %s %v, want positive and finite", c.Name, what, v)
			}
		}
		if !strings.Contains(c.Source, "self-benchmark") || !strings.Contains(c.Source, "real KV") {
			t.Errorf("%s: source %q", c.Name, c.Source)
		}
	}
	if diff := cmp.Diff(CodecNames(), names); diff != "" {
		t.Errorf("codecs (-CodecNames +measured):\n%s", diff)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := MeasureCodecs(ctx, time.Millisecond); err == nil {
		t.Error("MeasureCodecs with a cancelled context succeeded")
	}
}

// CodecFor models "auto" as the codec the prefill workers would pick on
// the planned link: the best-ratio lossless codec on a slow link (bf16
// on bf16 KV), none on a link faster than one core codes, and a lossy
// codec only for auto-lossy.
func TestCodecForAuto(t *testing.T) {
	for _, tc := range []struct {
		name  string
		gbps  float64
		cores int
		want  []string
	}{
		{"auto", 1, 16, []string{"bf16"}},
		{"auto", 400, 1, []string{"none"}},
		{"auto-lossy", 1, 16, []string{"fp8", "int8"}},
		{"s2", 1, 16, []string{"s2"}},
	} {
		c, err := CodecFor(tc.name, tc.gbps*1e9/8, tc.cores)
		if err != nil {
			t.Fatalf("%s at %v Gb/s: %v", tc.name, tc.gbps, err)
		}
		if !slices.Contains(tc.want, c.Name) {
			t.Errorf("%s at %v Gb/s, %d cores: %s (%s), want one of %v", tc.name, tc.gbps, tc.cores, c.Name, c.Source, tc.want)
		}
	}
	if _, err := CodecFor("lz4", 1e9, 1); !errors.Is(err, ErrUnknownCodec) {
		t.Errorf("CodecFor(lz4) = %v, want ErrUnknownCodec", err)
	}
}
