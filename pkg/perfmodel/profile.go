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
	// HostLinkBytesPerSec is the host-to-GPU link (PCIe), one direction,
	// bytes/s: what loading KV from host memory takes (a worker's host
	// tier). ≥ 0; 0: the GPU's figure from HostLinkBytesPerSec's table.
	HostLinkBytesPerSec float64 `json:"host_link_bytes_per_s,omitempty"`
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
// Mixed, zero in DistServe's own profiles, is what a step of both kinds
// costs beyond the sum of its parts, and PrefillCross what each prompt of
// a multi-prompt step costs for the others' cells (see StepSeconds).
// Context lengths count the new token, as DistServe's simulator does
// (context + 1). Pipeline parallelism (DistServe's ÷PP, + 1 ms per stage) is
// not modelled: profiles are pipeline-parallel 1.
type DistServe struct {
	Prefill             [3]float64 `json:"prefill_ms"`            // a ms, b ms/token, c ms/token²
	DecodeSmall         [3]float64 `json:"decode_small_batch_ms"` // a ms, b ms/context token, c ms/sequence
	DecodeLarge         [3]float64 `json:"decode_large_batch_ms"` // as DecodeSmall
	LargeBatchThreshold int        `json:"large_batch_threshold"` // sequences; > 0
	// Mixed is the interaction of a mixed step's parts: m0 ms, m1 ms per
	// decode context token, m2 ms per (chunk token × decode context
	// token); all ≥ 0, all 0 (omitted from the JSON) when not fitted.
	Mixed [3]float64 `json:"mixed_ms,omitzero"`
	// PrefillCross is x, ms per (chunk token × cell of another prompt in
	// the same step), see StepSeconds; ≥ 0, 0 (omitted) when not fitted.
	PrefillCross float64 `json:"prefill_cross_ms,omitzero"`
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
	// MaxKVTokens, when > 0, is one worker's KV pool in tokens as the
	// engine was configured (llama.cpp's --ctx-size cells), instead of
	// the capacity derived from the hardware's memory; Utilization and
	// ReserveBytesPerGPU are then unused and may be 0.
	MaxKVTokens int64 `json:"max_kv_tokens,omitempty"`
}

// Device is the kind of hardware a profile's workers run on.
type Device string

// The devices a profile can name.
const (
	// DeviceGPU: workers of TP GPUs each (the default: "" means GPU).
	DeviceGPU Device = "gpu"
	// DeviceCPU: workers of Threads CPU threads (cores) each, TP 1.
	DeviceCPU Device = "cpu"
)

// Profile is a GPU running a model at a tensor-parallel degree (or a CPU
// running it at a thread count), with the step-time form that predicts it
// and the data points it was calibrated against or measured at. Load and
// LoadFile return a fresh, validated copy; treat it as read-only
// afterwards (then it is safe for concurrent use).
type Profile struct {
	// Name is GPU/MODEL/tpN ("a100-80g/opt-13b/tp1"), or HW/MODEL/tN for
	// a CPU profile at N threads ("cpu/qwen2.5-0.5b/t1").
	Name  string `json:"name"`
	GPU   string `json:"gpu"`   // the hardware's name, e.g. "a100-80g", "h100", "cpu"
	Model string `json:"model"` // e.g. "opt-13b", "llama-3-8b"
	TP    int    `json:"tp"`    // tensor-parallel degree (GPUs per worker), ≥ 1; 1 on a CPU
	// Device is DeviceGPU (also when empty) or DeviceCPU.
	Device Device `json:"device,omitempty"`
	// Threads is a CPU profile's threads per worker (≥ 1; 0 on a GPU):
	// the cores one worker takes, where a GPU profile's worker takes TP
	// GPUs. See Units.
	Threads int `json:"threads,omitempty"`
	// Hardware holds one GPU's figures. The roofline form needs all of
	// them; a DistServe profile needs memory_bytes only when
	// Memory.MaxKVTokens is 0, and may leave the rest zero.
	Hardware GPUSpec    `json:"hardware,omitzero"`
	Spec     ModelShape `json:"spec"` // the model's shape
	// KVBytes, when > 0, is the KV of one token over all layers as the
	// engine holds and exports it, bytes (measured: f16 or q8_0 on
	// llama.cpp); 0 means the bf16 size of Spec (ModelShape.KVBytesPerToken).
	KVBytes int64 `json:"kv_bytes_per_token,omitempty"`
	Form    Form  `json:"form"` // which of DistServe and Roofline predicts step times
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
	// Measured, set on profiles written by `coordinator profile`, records
	// the engine, the hardware and the fit of a measured profile.
	Measured *Measurement `json:"measured,omitempty"`
}

// Units is how many units of the profile's device one worker takes: TP
// GPUs, or Threads cores on a CPU. The planner's budget and cost count
// these units.
func (p *Profile) Units() int {
	if p.CPU() {
		return p.Threads
	}
	return p.TP
}

// CPU reports whether the profile is of CPU workers (Device DeviceCPU).
func (p *Profile) CPU() bool { return p.Device == DeviceCPU }

// UnitName is the unit Units counts, singular: "GPU" or "core".
func (p *Profile) UnitName() string {
	if p.CPU() {
		return "core"
	}
	return "GPU"
}

// Host-link bandwidths, one direction, of the GPUs the embedded profiles
// name, from NVIDIA's data sheets (H100 and H200 SXM: "PCIe Gen5:
// 128GB/s", A100 80GB SXM: "PCIe Gen4: 64GB/s", both directions
// together): the nominal x16 link rates.
const (
	// PCIeGen5x16BytesPerSec is PCIe Gen5 x16, one direction (H100, H200).
	PCIeGen5x16BytesPerSec = 64e9
	// PCIeGen4x16BytesPerSec is PCIe Gen4 x16, one direction (A100), and
	// the figure of a GPU the table does not know.
	PCIeGen4x16BytesPerSec = 32e9
)

// HostLinkBytesPerSec returns the profile's host-to-GPU bandwidth in
// bytes/s, one direction: Hardware.HostLinkBytesPerSec when set, else
// PCIe Gen5 x16 for h100 and h200, else PCIe Gen4 x16 (a100-80g, a CPU
// profile, an unknown GPU). Always > 0.
func (p *Profile) HostLinkBytesPerSec() float64 {
	if p.Hardware.HostLinkBytesPerSec > 0 {
		return p.Hardware.HostLinkBytesPerSec
	}
	switch p.GPU {
	case "h100", "h200":
		return PCIeGen5x16BytesPerSec
	}
	return PCIeGen4x16BytesPerSec
}

// WantName is the name the profile's fields give it: GPU/MODEL/tpN, or
// GPU/MODEL/tN for a CPU profile of N threads.
func (p *Profile) WantName() string {
	if p.CPU() {
		return fmt.Sprintf("%s/%s/t%d", p.GPU, p.Model, p.Threads)
	}
	return fmt.Sprintf("%s/%s/tp%d", p.GPU, p.Model, p.TP)
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
	switch p.Device {
	case "", DeviceGPU:
		if p.Threads != 0 {
			return bad("threads %d on a GPU profile: a GPU worker's size is its tp", p.Threads)
		}
	case DeviceCPU:
		if p.Threads < 1 || p.TP != 1 {
			return bad("a cpu profile needs threads ≥ 1 (got %d) and tp 1 (got %d)", p.Threads, p.TP)
		}
		if p.Form != FormDistServe {
			return bad("a cpu profile needs form %q (the roofline models GPUs)", FormDistServe)
		}
	default:
		return bad("device %q is neither %q nor %q", p.Device, DeviceGPU, DeviceCPU)
	}
	if want := p.WantName(); p.Name != want {
		return bad("name must be %q", want)
	}
	if p.GPU == "" || p.Model == "" || strings.Contains(p.GPU+p.Model, "/") {
		return bad("gpu and model must be non-empty and free of '/'")
	}
	if p.TP < 1 {
		return bad("tp %d < 1", p.TP)
	}
	h := p.Hardware
	for _, x := range []float64{h.BF16FLOPS, h.HBMBytesPerSec, h.MemoryBytes, h.LinkBytesPerSec, h.HostLinkBytesPerSec} {
		if !(x >= 0) || math.IsInf(x, 0) {
			return bad("hardware figures must be finite and ≥ 0")
		}
	}
	if p.Form == FormRoofline && !(h.BF16FLOPS > 0 && h.HBMBytesPerSec > 0 && h.MemoryBytes > 0 && h.LinkBytesPerSec > 0) {
		return bad("hardware figures must be positive for the roofline form")
	}
	if p.Memory.MaxKVTokens < 0 {
		return bad("memory max_kv_tokens %d < 0", p.Memory.MaxKVTokens)
	}
	if p.Memory.MaxKVTokens == 0 && !(h.MemoryBytes > 0) {
		return bad("hardware memory_bytes must be positive unless memory max_kv_tokens is set")
	}
	if p.KVBytes < 0 {
		return bad("kv_bytes_per_token %d < 0", p.KVBytes)
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
		for _, v := range [][3]float64{d.Prefill, d.DecodeSmall, d.DecodeLarge, d.Mixed} {
			for _, x := range v {
				if math.IsNaN(x) || math.IsInf(x, 0) {
					return bad("distserve coefficients must be finite")
				}
			}
		}
		for _, x := range d.Mixed {
			if x < 0 {
				return bad("distserve mixed_ms coefficients must be ≥ 0")
			}
		}
		if !(d.PrefillCross >= 0) || math.IsInf(d.PrefillCross, 0) {
			return bad("distserve prefill_cross_ms must be finite and ≥ 0")
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
	if m := p.Memory; m.MaxKVTokens == 0 && (!(m.Utilization > 0 && m.Utilization <= 1) || !(m.ReserveBytesPerGPU >= 0)) {
		return bad("memory utilization must lie in (0, 1] and the reserve be ≥ 0")
	} else if m.MaxKVTokens > 0 && (!(m.Utilization >= 0 && m.Utilization <= 1) || !(m.ReserveBytesPerGPU >= 0)) {
		return bad("memory utilization must lie in [0, 1] and the reserve be ≥ 0")
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
	if p.Measured != nil {
		if err := p.checkMeasured(); err != nil {
			return bad("%v", err)
		}
	}
	return nil
}
