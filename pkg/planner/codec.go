package planner

import (
	"bytes"
	"context"
	_ "embed" // the built-in codec profile
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
	"github.com/pdserve/pdserve/pkg/kvtransfer/codecpick"
	"github.com/pdserve/pdserve/pkg/perfmodel"
)

// Codec is what the planner needs to know of a KV wire codec (package
// kv/codec): how much it shrinks KV and how fast one core codes it. The
// figures come from a CodecProfile (data measured on some machine), never
// from the machine the planner runs on unless asked (CodecProfileSelf).
type Codec struct {
	Name string `json:"name"`
	// Ratio is raw bytes over wire bytes, > 0.
	Ratio float64 `json:"ratio"`
	// EncodeBytesPerSec and DecodeBytesPerSec are raw bytes/s one core
	// encodes and decodes; 0 means the codec never limits the transfer
	// (always so for "none", which costs no CPU time: only the link).
	EncodeBytesPerSec float64 `json:"encode_bytes_per_s_per_core"`
	DecodeBytesPerSec float64 `json:"decode_bytes_per_s_per_core"`
	Lossless          bool    `json:"lossless"`
	// Source says where the figures come from (empty inside a
	// CodecProfile file: the profile says it for all of them).
	Source string `json:"source,omitempty"`
}

// ErrUnknownCodec is returned by CodecByName; match with errors.Is.
var ErrUnknownCodec = errors.New("planner: unknown codec")

// ErrCodecProfile reports an unusable codec profile; match with errors.Is.
var ErrCodecProfile = errors.New("planner: bad codec profile")

// CodecNone is the codec that sends raw bytes: no CPU time, only the link.
const CodecNone = "none"

// CodecProfile holds the codec figures of one machine, as the codec
// self-benchmark (codec.SelfBench, the one the prefill workers run for
// --codec auto) measured them there: `coordinator codecs --out FILE` on
// the machine whose CPUs will code KV (a GPU node of the target cluster)
// writes it; `coordinator plan --codec-profile FILE` plans with it.
// The ratios are on the benchmark's synthetic KV, not on real KV: s2 and
// zstd measure about 1.0× on it and more on real tensors, the byte-plane
// codec a little more on real KV; the lossy codecs' ratios are exact by
// their format (override with --codec-ratio when a real ratio is known).
type CodecProfile struct {
	// Tool is what measured it ("coordinator codecs"), Command the
	// command line.
	Tool    string `json:"tool"`
	Command string `json:"command"`
	// Hardware is the machine it was measured on; GoVersion the Go
	// release that built the measuring binary.
	Hardware  perfmodel.Host `json:"hardware"`
	GoVersion string         `json:"go_version"`
	DType     string         `json:"dtype"` // the KV element type of the sample, e.g. bf16
	// CPUTime is true when speeds are over the benchmarking thread's CPU
	// time (Linux: a busy neighbour does not slow them), false when over
	// wall time.
	CPUTime     bool    `json:"cpu_time"`
	BudgetS     float64 `json:"budget_s"`     // the time the benchmark was given, seconds
	SampleBytes int     `json:"sample_bytes"` // raw bytes of the benchmark's sample
	// Codecs are the measured codecs, in the order of CodecNames; "none"
	// has speeds 0 (it costs no CPU time).
	Codecs []Codec `json:"codecs"`

	// origin says where the profile was read from: "built-in", a file
	// name, or "measured now on this machine".
	origin string
}

// The names LoadCodecProfile knows besides file names.
const (
	// CodecProfileBuiltin is the profile embedded in the planner
	// (codecs/default.json: the command and CPU that measured it are in
	// it), so that a plan does not depend on the planning machine.
	CodecProfileBuiltin = "builtin"
	// CodecProfileSelf measures this machine now (once per process): a
	// plan then depends on this machine and on its load.
	CodecProfileSelf = "self"
)

//go:embed codecs/default.json
var builtinCodecProfile []byte

// builtin is the parsed built-in profile.
var builtin = sync.OnceValues(func() (*CodecProfile, error) {
	p, err := ParseCodecProfile(builtinCodecProfile)
	if err != nil {
		return nil, fmt.Errorf("planner: built-in codec profile: %w", err)
	}
	p.origin = "built-in codec profile (pkg/planner/codecs/default.json)"
	return p, nil
})

// self is this machine's profile, measured once per process.
var self = sync.OnceValues(func() (*CodecProfile, error) {
	p, err := MeasureCodecProfile(context.Background(), codec.DefaultBenchBudget, perfmodel.Host{}, "")
	if err != nil {
		return nil, err
	}
	p.origin = "codec profile measured now on the planning machine (--codec-profile self: the plan follows its load)"
	return p, nil
})

// MeasureCodecProfile runs the codec self-benchmark (codec.SelfBench) on
// bf16 KV on the calling goroutine, within about budget (≤ 0:
// codec.DefaultBenchBudget), and returns every codec of package kv/codec
// with its ratio and per-core speeds as measured on this machine, in the
// order of CodecNames; "none" gets speeds 0 (it copies nothing that a
// send would not). host and command describe the machine and the command
// line for the file. Errors: SelfBench's, wrapped.
func MeasureCodecProfile(ctx context.Context, budget time.Duration, host perfmodel.Host, command string) (*CodecProfile, error) {
	if budget <= 0 {
		budget = codec.DefaultBenchBudget
	}
	sp, err := codec.SelfBench(ctx, engine.BF16, budget)
	if err != nil {
		return nil, fmt.Errorf("planner: codec speeds: %w", err)
	}
	if host == (perfmodel.Host{}) {
		host = perfmodel.Host{LogicalCPUs: runtime.NumCPU(), Threads: 1, OS: runtime.GOOS, Arch: runtime.GOARCH}
	}
	p := &CodecProfile{
		Tool: "coordinator codecs", Command: command, Hardware: host, GoVersion: runtime.Version(), DType: sp.DType.String(),
		CPUTime: sp.CPUTime, BudgetS: budget.Seconds(), SampleBytes: sp.SampleBytes,
	}
	for _, c := range sp.Codecs {
		cd := Codec{Name: c.Codec, Ratio: c.Ratio, Lossless: c.Lossless,
			EncodeBytesPerSec: c.EncodeBytesPerSec, DecodeBytesPerSec: c.DecodeBytesPerSec}
		if cd.Name == CodecNone {
			cd.EncodeBytesPerSec, cd.DecodeBytesPerSec = 0, 0
		}
		p.Codecs = append(p.Codecs, cd)
	}
	return p, nil
}

// ParseCodecProfile decodes and checks a codec profile (JSON, unknown
// fields are errors): known codec names, each once, ratios > 0, speeds
// finite and ≥ 0, "none" at ratio 1. Speeds of "none" are set to 0.
// Errors: ErrCodecProfile.
func ParseCodecProfile(data []byte) (*CodecProfile, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	p := new(CodecProfile)
	if err := dec.Decode(p); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCodecProfile, err)
	}
	if len(p.Codecs) == 0 {
		return nil, fmt.Errorf("%w: no codecs", ErrCodecProfile)
	}
	seen := map[string]bool{}
	for i := range p.Codecs {
		c := &p.Codecs[i]
		switch {
		case !slices.Contains(CodecNames(), c.Name):
			return nil, fmt.Errorf("%w: codec %q: %w", ErrCodecProfile, c.Name, ErrUnknownCodec)
		case seen[c.Name]:
			return nil, fmt.Errorf("%w: codec %q twice", ErrCodecProfile, c.Name)
		case c.Name == CodecNone && c.Ratio != 1:
			return nil, fmt.Errorf("%w: codec none has ratio %v, want 1", ErrCodecProfile, c.Ratio)
		}
		if err := c.validate(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrCodecProfile, err)
		}
		seen[c.Name] = true
		if c.Name == CodecNone {
			c.EncodeBytesPerSec, c.DecodeBytesPerSec = 0, 0
		}
	}
	return p, nil
}

// Marshal returns p as indented JSON, the format ParseCodecProfile reads.
func (p *CodecProfile) Marshal() ([]byte, error) {
	data, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("planner: codec profile: %w", err)
	}
	return append(data, '\n'), nil
}

// LoadCodecProfile returns the codec profile called name:
// CodecProfileBuiltin (also for ""), CodecProfileSelf, or a JSON file
// written by `coordinator codecs --out`. Errors: the file's, or
// ErrCodecProfile, or the benchmark's for CodecProfileSelf.
func LoadCodecProfile(name string) (*CodecProfile, error) {
	switch name {
	case "", CodecProfileBuiltin:
		return builtin()
	case CodecProfileSelf:
		return self()
	}
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("planner: codec profile: %w", err)
	}
	p, err := ParseCodecProfile(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p.origin = "codec profile " + name
	return p, nil
}

// Origin says where p was read from ("" for a profile not loaded by
// LoadCodecProfile).
func (p *CodecProfile) Origin() string { return p.origin }

// source is the Source of p's codecs.
func (p *CodecProfile) source() string {
	h := p.Hardware
	cpu := or(h.CPU, "an unnamed CPU")
	var b strings.Builder
	fmt.Fprintf(&b, "%s: measured by `%s` on %s", or(p.origin, "codec profile"), or(p.Command, p.Tool), cpu)
	if h.LogicalCPUs > 0 {
		fmt.Fprintf(&b, " (%d logical CPUs, %s/%s", h.LogicalCPUs, h.OS, h.Arch)
		if p.GoVersion != "" {
			fmt.Fprintf(&b, ", %s", p.GoVersion)
		}
		b.WriteString(")")
	}
	timing := "wall time"
	if p.CPUTime {
		timing = "thread CPU time"
	}
	fmt.Fprintf(&b, ", one core's %s, synthetic %s KV (real KV's ratios differ)", timing, or(p.DType, "bf16"))
	return b.String()
}

// Codec returns the model of the codec called name with p's figures and
// Source. Errors: ErrUnknownCodec.
func (p *CodecProfile) Codec(name string) (Codec, error) {
	if !slices.Contains(CodecNames(), name) {
		return Codec{}, fmt.Errorf("%w %q (want one of %s)", ErrUnknownCodec, name, strings.Join(CodecNames(), ", "))
	}
	i := slices.IndexFunc(p.Codecs, func(c Codec) bool { return c.Name == name })
	if i < 0 {
		return Codec{}, fmt.Errorf("%w %q: not in the codec profile", ErrUnknownCodec, name)
	}
	c := p.Codecs[i]
	c.Source = p.source()
	if name == CodecNone {
		c.Source = "codec none sends raw bytes, so no codec profile applies"
	}
	return c, nil
}

// CodecFor returns the codec model the planner uses for the codec named
// name: Codec's, or, for codecpick.Auto and codecpick.AutoLossy (the
// prefill workers choose per transfer), the codec codecpick.Pick chooses
// among p's for a link of linkBytesPerSec with cores coding at each end,
// as a worker whose link measured that would. Errors: ErrUnknownCodec.
func (p *CodecProfile) CodecFor(name string, linkBytesPerSec float64, cores int) (Codec, error) {
	auto, lossy := codecpick.AutoName(name)
	if !auto {
		return p.Codec(name)
	}
	cands := make([]codecpick.Candidate, len(p.Codecs))
	for i, c := range p.Codecs {
		cands[i] = codecpick.Candidate{Name: c.Name, Lossless: c.Lossless, Ratio: c.Ratio, EncodeBytesPerSec: c.EncodeBytesPerSec, DecodeBytesPerSec: c.DecodeBytesPerSec}
		if c.EncodeBytesPerSec == 0 {
			// Pick skips a candidate without an encode speed; a codec
			// that never limits (none) is as fast as can be.
			cands[i].EncodeBytesPerSec = math.MaxFloat64 / 1024
		}
	}
	// The choice does not depend on the bytes: every candidate's time is
	// proportional to them.
	ch, err := codecpick.Pick(codecpick.Input{RawBytes: 1 << 20, LinkBytesPerSec: linkBytesPerSec,
		EncodeCores: float64(max(cores, 1)), DecodeCores: float64(max(cores, 1)), AllowLossy: lossy, Candidates: cands})
	if err != nil {
		return Codec{}, fmt.Errorf("%w %q: %w", ErrUnknownCodec, name, err)
	}
	c, err := p.Codec(ch.Codec)
	if err != nil {
		return Codec{}, err
	}
	c.Source = fmt.Sprintf("%s's choice for a %.4g Gb/s link at %d cores: %s; %s", name, linkBytesPerSec*8/1e9, max(cores, 1), ch.Reason, c.Source)
	return c, nil
}

// CodecNames returns the names CodecByName knows (package kv/codec's), in
// a fixed order.
func CodecNames() []string { return codec.Names() }

// CodecByName returns the model of the codec called name with the figures
// of the built-in codec profile (CodecProfileBuiltin). Errors:
// ErrUnknownCodec.
func CodecByName(name string) (Codec, error) {
	p, err := builtin()
	if err != nil {
		return Codec{}, err
	}
	return p.Codec(name)
}

// CodecFor is the built-in codec profile's CodecFor.
func CodecFor(name string, linkBytesPerSec float64, cores int) (Codec, error) {
	p, err := builtin()
	if err != nil {
		return Codec{}, err
	}
	return p.CodecFor(name, linkBytesPerSec, cores)
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
