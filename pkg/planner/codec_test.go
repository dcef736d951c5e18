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

	"github.com/pdserve/pdserve/pkg/perfmodel"
)

// A codec profile comes from the codec self-benchmark: every codec,
// positive finite speeds but none's (0: it costs no CPU time), and it
// reads back as written.
func TestMeasureCodecProfile(t *testing.T) {
	p, err := MeasureCodecProfile(context.Background(), 20*time.Millisecond, perfmodel.Host{}, "test")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range p.Codecs {
		names = append(names, c.Name)
		if err := c.validate(); err != nil {
			t.Error(err)
		}
		for what, v := range map[string]float64{"encode": c.EncodeBytesPerSec, "decode": c.DecodeBytesPerSec, "ratio": c.Ratio} {
			if c.Name == CodecNone && what != "ratio" {
				if v != 0 {
					t.Errorf("none: %s %v, want 0 (no CPU time)", what, v)
				}
				continue
			}
			if !(v > 0) || math.IsInf(v, 0) {
				t.Errorf("%s: %s %v, want positive and finite", c.Name, what, v)
			}
		}
	}
	if diff := cmp.Diff(CodecNames(), names); diff != "" {
		t.Errorf("codecs (-CodecNames +measured):\n%s", diff)
	}
	if p.Hardware.LogicalCPUs < 1 || p.GoVersion == "" || p.DType != "bf16" {
		t.Errorf("profile lacks its machine: %+v", p)
	}
	data, err := p.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseCodecProfile(data)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(p, back, cmp.AllowUnexported(CodecProfile{})); diff != "" {
		t.Errorf("round trip (-measured +read):\n%s", diff)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := MeasureCodecProfile(ctx, time.Millisecond, perfmodel.Host{}, ""); err == nil {
		t.Error("MeasureCodecProfile with a cancelled context succeeded")
	}
}

// The built-in profile names the command and the CPU that measured it,
// and the planner's codecs carry that as their source; none never
// limits a transfer but by the link, whatever a file says of its speed.
func TestBuiltinCodecProfile(t *testing.T) {
	p, err := LoadCodecProfile(CodecProfileBuiltin)
	if err != nil {
		t.Fatal(err)
	}
	if p.Command == "" || p.Hardware.CPU == "" || p.Hardware.LogicalCPUs < 1 || !strings.Contains(p.Origin(), "built-in") {
		t.Errorf("built-in profile does not say where it comes from: %+v", p)
	}
	var names []string
	for _, c := range p.Codecs {
		names = append(names, c.Name)
	}
	if diff := cmp.Diff(CodecNames(), names); diff != "" {
		t.Errorf("built-in codecs (-CodecNames +profile):\n%s", diff)
	}
	z, err := CodecByName("zstd")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"built-in codec profile", p.Command, p.Hardware.CPU} {
		if !strings.Contains(z.Source, want) {
			t.Errorf("zstd source %q lacks %q", z.Source, want)
		}
	}
	n, err := CodecByName(CodecNone)
	if err != nil {
		t.Fatal(err)
	}
	if n.EncodeBytesPerSec != 0 || n.DecodeBytesPerSec != 0 || n.rawRate(12.5e9, 1) != 12.5e9 {
		t.Errorf("none %+v: raw rate %v on a 100 Gb/s link at 1 core, want the link's 12.5e9", n, n.rawRate(12.5e9, 1))
	}
	file := `{"tool":"t","command":"c","hardware":{"cpu":"x","logical_cpus":1,"threads":1,"os":"linux","arch":"amd64"},
		"go_version":"go","dtype":"bf16","cpu_time":true,"budget_s":1,"sample_bytes":1,
		"codecs":[{"name":"none","ratio":1,"encode_bytes_per_s_per_core":1.5e9,"decode_bytes_per_s_per_core":1.5e9,"lossless":true}]}`
	q, err := ParseCodecProfile([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := q.Codec(CodecNone); c.EncodeBytesPerSec != 0 || c.DecodeBytesPerSec != 0 {
		t.Errorf("none read with speeds %+v, want 0", c)
	}
	if _, err := q.Codec("zstd"); !errors.Is(err, ErrUnknownCodec) {
		t.Errorf("a codec the file lacks: %v", err)
	}
}

func TestParseCodecProfileErrors(t *testing.T) {
	head := `{"tool":"t","command":"c","hardware":{"cpu":"x","logical_cpus":1,"threads":1,"os":"linux","arch":"amd64"},"go_version":"go","dtype":"bf16","cpu_time":true,"budget_s":1,"sample_bytes":1,`
	for name, body := range map[string]string{
		"no codecs":     `"codecs":[]}`,
		"unknown codec": `"codecs":[{"name":"lz4","ratio":2,"encode_bytes_per_s_per_core":1,"decode_bytes_per_s_per_core":1,"lossless":true}]}`,
		"twice":         `"codecs":[{"name":"s2","ratio":1,"encode_bytes_per_s_per_core":1,"decode_bytes_per_s_per_core":1,"lossless":true},{"name":"s2","ratio":1,"encode_bytes_per_s_per_core":1,"decode_bytes_per_s_per_core":1,"lossless":true}]}`,
		"zero ratio":    `"codecs":[{"name":"s2","ratio":0,"encode_bytes_per_s_per_core":1,"decode_bytes_per_s_per_core":1,"lossless":true}]}`,
		"none ratio":    `"codecs":[{"name":"none","ratio":2,"encode_bytes_per_s_per_core":0,"decode_bytes_per_s_per_core":0,"lossless":true}]}`,
		"negative":      `"codecs":[{"name":"s2","ratio":1,"encode_bytes_per_s_per_core":-1,"decode_bytes_per_s_per_core":1,"lossless":true}]}`,
		"unknown field": `"codecs":[{"name":"s2","ratio":1,"speed":1}]}`,
	} {
		if _, err := ParseCodecProfile([]byte(head + body)); !errors.Is(err, ErrCodecProfile) {
			t.Errorf("%s: %v, want ErrCodecProfile", name, err)
		}
	}
	if _, err := LoadCodecProfile(t.TempDir() + "/missing.json"); err == nil {
		t.Error("a missing file loaded")
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
