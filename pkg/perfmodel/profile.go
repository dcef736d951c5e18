package perfmodel

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"slices"
	"strings"
)

// Form names a step-time form.
type Form string

// The step-time forms a profile can carry.
const (
	// FormDistServe is DistServe's fitted latency model (see DistServe).
	FormDistServe Form = "distserve"
	// FormRoofline is the roofline over GPU specs and model shape (see
	// Roofline).
	FormRoofline Form = "roofline"
)

// GPUSpec holds the figures of one accelerator that the roofline uses. All
// values are per GPU and > 0 in a valid profile.
type GPUSpec struct {
	BF16FLOPS       float64 `json:"bf16_flops"`       // dense bf16 peak, FLOP/s
	HBMBytesPerSec  float64 `json:"hbm_bytes_per_s"`  // HBM bandwidth, bytes/s
	MemoryBytes     float64 `json:"memory_bytes"`     // HBM capacity, bytes
	LinkBytesPerSec float64 `json:"link_bytes_per_s"` // GPU-to-GPU link (NVLink), one direction, bytes/s
}

// ModelShape is a decoder-only transformer's shape, for the whole model
// (not one tensor-parallel shard).
type ModelShape struct {
	Params         float64 `json:"params"`          // parameter count, embeddings included
	Layers         int     `json:"layers"`          // transformer blocks
	Hidden         int     `json:"hidden"`          // model width
	Heads          int     `json:"heads"`           // query heads
	KVHeads        int     `json:"kv_heads"`        // key/value heads (= Heads for multi-head attention)
	HeadDim        int     `json:"head_dim"`        // elements per head
	Intermediate   int     `json:"intermediate"`    // MLP inner width
	Vocab          int     `json:"vocab"`           // vocabulary of the real model
	MaxSeqLen      int     `json:"max_seq_len"`     // longest sequence, tokens
	TiedEmbeddings bool    `json:"tied_embeddings"` // the LM head shares the input embedding
	RopeTheta      float64 `json:"rope_theta"`      // RoPE base; 0 for learned positions (OPT)
}

// KVBytesPerToken is the bf16 KV size of one token over all layers:
// 2 (K and V) × Layers × KVHeads × HeadDim × 2 bytes.
func (m ModelShape) KVBytesPerToken() int64 {
	return 2 * int64(m.Layers) * int64(m.KVHeads) * int64(m.HeadDim) * 2
}

// headParams is the parameter count of the LM head (Vocab × Hidden).
func (m ModelShape) headParams() float64 { return float64(m.Vocab) * float64(m.Hidden) }

// bodyParams is the parameter count of the transformer blocks (and the
// small position tables): everything but the embedding and the LM head.
func (m ModelShape) bodyParams() float64 {
	emb := m.headParams()
	if !m.TiedEmbeddings {
		emb *= 2
	}
	return m.Params - emb
}

// WeightBytes is the bf16 size of the weights one step reads: the body and
// the LM head (an untied input embedding is a lookup, not read whole).
func (m ModelShape) WeightBytes() float64 {
	return 2 * (m.bodyParams() + m.headParams())
}

// DistServe holds DistServe's fitted coefficients, all in milliseconds.
//
//	prefill of prompts lᵢ:               a + b·Σlᵢ + c·Σlᵢ²
//	decode of B sequences at context nᵢ: a + b·Σnᵢ + c·B
//
// Decode uses DecodeSmall when B < LargeBatchThreshold, else DecodeLarge.
// Context lengths count the new token, as DistServe's simulator does
// (context + 1). Pipeline parallelism (DistServe's ÷PP, + 1 ms per stage) is
// not modelled: profiles are pipeline-parallel 1.
type DistServe struct {
	Prefill             [3]float64 `json:"prefill_ms"`            // a ms, b ms/token, c ms/token²
	DecodeSmall         [3]float64 `json:"decode_small_batch_ms"` // a ms, b ms/context token, c ms/sequence
	DecodeLarge         [3]float64 `json:"decode_large_batch_ms"` // as DecodeSmall
	LargeBatchThreshold int        `json:"large_batch_threshold"` // sequences; > 0
}

// Roofline holds the calibrated factors of the roofline form. Efficiencies
// lie in (0, 1]; see StepTime for how they enter.
type Roofline struct {
	ComputeEfficiency   float64 `json:"compute_efficiency"`   // GEMM FLOP/s as a fraction of peak
	AttentionEfficiency float64 `json:"attention_efficiency"` // prefill attention FLOP/s as a fraction of peak
	MemoryEfficiency    float64 `json:"memory_efficiency"`    // achieved HBM bandwidth as a fraction of peak
	// Overlap is the exponent p ≥ 1 of the smooth maximum (cᵖ + mᵖ)^(1/p)
	// that combines GEMM compute time c and weight-read time m: 1 adds
	// them, a large p approaches max(c, m).
	Overlap            float64 `json:"overlap"`
	StepOverheadMs     float64 `json:"step_overhead_ms"`     // fixed cost per step (launches, scheduling), ms ≥ 0
	SeqOverheadMs      float64 `json:"seq_overhead_ms"`      // cost per sequence in the step (sampling, metadata), ms ≥ 0
	AllReduceLatencyUs float64 `json:"allreduce_latency_us"` // latency of one tensor-parallel all-reduce, µs ≥ 0
}

// Memory says how much of the GPUs' memory the KV pool may take.
type Memory struct {
	Utilization        float64 `json:"utilization"`           // fraction of HBM the engine uses, (0, 1]
	ReserveBytesPerGPU float64 `json:"reserve_bytes_per_gpu"` // activations and workspace, bytes ≥ 0
}

// Profile is a GPU running a model at a tensor-parallel degree, with the
// step-time form that predicts it and the data points it was calibrated
// against. Load and LoadFile return a fresh, validated copy; treat it as
// read-only afterwards (then it is safe for concurrent use).
type Profile struct {
	Name     string     `json:"name"`     // GPU/MODEL/tpN, e.g. "a100-80g/opt-13b/tp1"
	GPU      string     `json:"gpu"`      // e.g. "a100-80g", "h100", "h200"
	Model    string     `json:"model"`    // e.g. "opt-13b", "llama-3-8b"
	TP       int        `json:"tp"`       // tensor-parallel degree (GPUs per worker), ≥ 1
	Hardware GPUSpec    `json:"hardware"` // one GPU's figures
	Spec     ModelShape `json:"spec"`     // the model's shape
	Form     Form       `json:"form"`     // which of DistServe and Roofline predicts step times
	// DistServe is set when Form is FormDistServe.
	DistServe *DistServe `json:"distserve,omitempty"`
	// Roofline is set when Form is FormRoofline; a DistServe profile may
	// carry it too (it is then unused by StepTime).
	Roofline *Roofline `json:"roofline,omitempty"`
	Memory   Memory    `json:"memory"`

	Source      string `json:"source"`            // where the coefficients or calibration points come from
	License     string `json:"license,omitempty"` // licence of copied figures, when any
	Calibration string `json:"calibration"`       // how the form's parameters were obtained
	// Tolerance is the largest relative error |model − source| / source
	// allowed for points checked as CheckFit, e.g. 0.15.
	Tolerance float64 `json:"tolerance"`
	Points    []Point `json:"points"`
}

// Errors returned by Load, LoadFile and Resolve; match with errors.Is.
var (
	ErrUnknownProfile = errors.New("perfmodel: unknown profile")
	ErrInvalidProfile = errors.New("perfmodel: invalid profile")
)

//go:embed profiles
var embedded embed.FS

const profileDir = "profiles"

// Names returns the names of the embedded profiles, sorted. The slice is
// the caller's.
func Names() []string {
	var names []string
	err := fs.WalkDir(embedded, profileDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".json") {
			names = append(names, strings.TrimSuffix(strings.TrimPrefix(p, profileDir+"/"), ".json"))
		}
		return nil
	})
	if err != nil { // the embedded tree is fixed at build time
		panic(fmt.Sprintf("perfmodel: walk embedded profiles: %v", err))
	}
	slices.Sort(names)
	return names
}

// Load returns the embedded profile called name (GPU/MODEL/tpN, e.g.
// "h100/llama-3-8b/tp1"; case is ignored). Errors: ErrUnknownProfile (the
// message lists the known names), ErrInvalidProfile.
func Load(name string) (*Profile, error) {
	name = strings.ToLower(name)
	if !fs.ValidPath(name) || strings.Count(name, "/") != 2 {
		return nil, fmt.Errorf("%w %q (want GPU/MODEL/tpN, one of %s)", ErrUnknownProfile, name, strings.Join(Names(), ", "))
	}
	data, err := embedded.ReadFile(path.Join(profileDir, name+".json"))
	if err != nil {
		return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknownProfile, name, strings.Join(Names(), ", "))
	}
	p, err := Parse(data)
	if err != nil {
		return nil, err
	}
	if p.Name != name {
		return nil, fmt.Errorf("%w: embedded file %s.json holds profile %q", ErrInvalidProfile, name, p.Name)
	}
	return p, nil
}

// LoadFile reads a profile from a JSON file in the format of the embedded
// ones. Errors: the file's read error, ErrInvalidProfile.
func LoadFile(filename string) (*Profile, error) {
	data, err := os.ReadFile(filename)
	if err != nil {
		return nil, fmt.Errorf("perfmodel: read profile: %w", err)
	}
	p, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filename, err)
	}
	return p, nil
}

// Resolve loads a profile named on a command line: a path ending in ".json"
// is read with LoadFile, anything else is an embedded name for Load.
func Resolve(nameOrFile string) (*Profile, error) {
	if strings.HasSuffix(nameOrFile, ".json") {
		return LoadFile(nameOrFile)
	}
	return Load(nameOrFile)
}

// Parse decodes and validates one profile from JSON. Unknown fields are
// errors, so a misspelt coefficient does not silently become zero. Errors:
// ErrInvalidProfile.
func Parse(data []byte) (*Profile, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	p := new(Profile)
	if err := dec.Decode(p); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidProfile, err)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// Validate reports, wrapped in ErrInvalidProfile, the first problem that
// makes the profile unusable.
func (p *Profile) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w %q: %s", ErrInvalidProfile, p.Name, fmt.Sprintf(format, args...))
	}
	if want := fmt.Sprintf("%s/%s/tp%d", p.GPU, p.Model, p.TP); p.Name != want {
		return bad("name must be GPU/MODEL/tpN = %q", want)
	}
	if p.GPU == "" || p.Model == "" || strings.Contains(p.GPU+p.Model, "/") {
		return bad("gpu and model must be non-empty and free of '/'")
	}
	if p.TP < 1 {
		return bad("tp %d < 1", p.TP)
	}
	h := p.Hardware
	if !(h.BF16FLOPS > 0 && h.HBMBytesPerSec > 0 && h.MemoryBytes > 0 && h.LinkBytesPerSec > 0) {
		return bad("hardware figures must be positive")
	}
	s := p.Spec
	if !(s.Params > 0) || s.Layers <= 0 || s.Hidden <= 0 || s.Heads <= 0 || s.KVHeads <= 0 || s.HeadDim <= 0 ||
		s.Intermediate <= 0 || s.Vocab <= 0 || s.MaxSeqLen <= 0 {
		return bad("model shape counts must be positive")
	}
	if s.Heads%s.KVHeads != 0 {
		return bad("heads %d not a multiple of kv heads %d", s.Heads, s.KVHeads)
	}
	if !(s.bodyParams() > 0) {
		return bad("params %.4g too small for vocab × hidden", s.Params)
	}
	switch p.Form {
	case FormDistServe:
		d := p.DistServe
		if d == nil {
			return bad("form distserve needs distserve coefficients")
		}
		if d.LargeBatchThreshold <= 0 {
			return bad("distserve large_batch_threshold must be positive")
		}
		for _, v := range [][3]float64{d.Prefill, d.DecodeSmall, d.DecodeLarge} {
			for _, x := range v {
				if math.IsNaN(x) || math.IsInf(x, 0) {
					return bad("distserve coefficients must be finite")
				}
			}
		}
	case FormRoofline:
		if p.Roofline == nil {
			return bad("form roofline needs roofline factors")
		}
	default:
		return bad("form %q is neither %q nor %q", p.Form, FormDistServe, FormRoofline)
	}
	if r := p.Roofline; r != nil {
		eff := func(x float64) bool { return x > 0 && x <= 1 }
		if !eff(r.ComputeEfficiency) || !eff(r.AttentionEfficiency) || !eff(r.MemoryEfficiency) {
			return bad("roofline efficiencies must lie in (0, 1]")
		}
		if !(r.Overlap >= 1) || math.IsInf(r.Overlap, 0) {
			return bad("roofline overlap must be a finite number ≥ 1")
		}
		if !(r.StepOverheadMs >= 0 && r.SeqOverheadMs >= 0 && r.AllReduceLatencyUs >= 0) {
			return bad("roofline overheads must be ≥ 0")
		}
	}
	if m := p.Memory; !(m.Utilization > 0 && m.Utilization <= 1) || !(m.ReserveBytesPerGPU >= 0) {
		return bad("memory utilization must lie in (0, 1] and the reserve be ≥ 0")
	}
	if !(p.Tolerance >= 0) {
		return bad("tolerance must be ≥ 0")
	}
	if p.Source == "" {
		return bad("source must say where the figures come from")
	}
	for i := range p.Points {
		if err := p.Points[i].validate(); err != nil {
			return bad("point %d (%q): %v", i, p.Points[i].Name, err)
		}
	}
	return nil
}
