package gguf

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// RandomOptions describes a random-weight model: an architecture, the
// vocab GGUF whose tokenizer it uses, and the hyper-parameters.
type RandomOptions struct {
	// Arch is the llama.cpp architecture: see Archs.
	Arch string
	// Vocab is the path of a vocab GGUF (llama.cpp's ggml-vocab-*.gguf or
	// any model GGUF): its tokenizer.* keys are copied and its token list
	// fixes the vocab size. When no file exists at Vocab and it is a bare
	// file name, it is looked up in VocabDir.
	Vocab string
	// Name is general.name; empty gives "random-<arch>-<layers>x<hidden>"
	// (Complete).
	Name string

	Layers  int // transformer blocks
	Hidden  int // embedding length; a multiple of Heads
	Heads   int // attention (query) heads; Hidden/Heads is the head size, even
	KVHeads int // key/value heads; divides Heads
	FFN     int // feed-forward (SwiGLU) inner size
	Context int // training context length in tokens

	// Type is the type of the two-dimensional weights, token embedding
	// and output included: F32, F16 or Q8_0 (Q8_0 needs Hidden and FFN to
	// be multiples of 32). Norms and biases are always F32.
	Type TensorType
	// Seed fixes every weight: the same options give the same file, byte
	// for byte.
	Seed uint64
	// RopeTheta is the RoPE frequency base; 0 takes the arch's default
	// (Complete). Stored as float32.
	RopeTheta float64
	// RMSEps is the RMSNorm epsilon; 0 takes the arch's default
	// (Complete). Stored as float32.
	RMSEps float64
	// Tied leaves out output.weight, so llama.cpp reuses token_embd.weight
	// as the output projection (as Qwen2.5-0.5B does). Greedy output of a
	// tied model of many layers falls into runs of one token.
	Tied bool
}

// archSpec is what differs between the llama-family architectures this
// generator writes. To add an architecture, add an entry to archs (and, if
// its blocks differ, a tensor list beside llamaTensors).
type archSpec struct {
	ropeTheta float64
	rmsEps    float64
	// tensors lists the model's tensors in file order.
	tensors func(o *RandomOptions, vocab int) []tensorSpec
}

var archs = map[string]archSpec{
	// llama.cpp src/models/llama.cpp
	"llama": {ropeTheta: 10000, rmsEps: 1e-5,
		tensors: func(o *RandomOptions, vocab int) []tensorSpec { return llamaTensors(o, vocab, false) }},
	// llama.cpp src/models/qwen2.cpp: llama blocks plus q/k/v biases.
	"qwen2": {ropeTheta: 1e6, rmsEps: 1e-6,
		tensors: func(o *RandomOptions, vocab int) []tensorSpec { return llamaTensors(o, vocab, true) }},
}

// Archs returns the architectures RandomModel writes, sorted.
func Archs() []string {
	names := make([]string, 0, len(archs))
	for n := range archs {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// initKind says how a tensor's values are drawn.
type initKind int

const (
	initOnes    initKind = iota // norm weights
	initUniform                 // U(-√3σ, √3σ): mean 0, standard deviation σ
)

type tensorSpec struct {
	name  string
	shape []uint64
	typ   TensorType
	init  initKind
	sigma float64
}

// Standard deviations of the random weights. A linear map with fan-in n
// gets σ = 1/√n, so every projection keeps its input's scale (RMSNorm
// gives inputs of RMS 1) and logits have a standard deviation near 1; the
// two projections into the residual stream per block get σ/√(2·layers)
// (GPT-2's scaled init), else the stream of a deep model is dominated by
// slowly varying context and greedy output repeats one token for long runs.
// Input embeddings get σ = 1 so a token's identity stays visible in the
// residual stream; biases are small. With tied embeddings token_embd is the
// output projection too and gets 1/√hidden. Greedy output of a tied model
// of 24 layers falls into long runs of one token whatever the embedding's
// σ (0.001 to 1 tried), so output.weight is written unless Tied is set.
const (
	sigmaEmbed = 1.0
	sigmaBias  = 0.1
)

// llamaTensors lists the tensors of a llama-style decoder (names and
// shapes of llama.cpp's LLM_TENSOR_* for llama and qwen2).
func llamaTensors(o *RandomOptions, vocab int, qkvBias bool) []tensorSpec {
	h, ff := uint64(o.Hidden), uint64(o.FFN)
	kv := uint64(o.Hidden / o.Heads * o.KVHeads)
	w := func(name string, in, out uint64) tensorSpec {
		return tensorSpec{name: name, shape: []uint64{in, out}, typ: o.Type, init: initUniform, sigma: 1 / math.Sqrt(float64(in))}
	}
	ones := func(name string, n uint64) tensorSpec {
		return tensorSpec{name: name, shape: []uint64{n}, typ: F32, init: initOnes}
	}
	bias := func(name string, n uint64) tensorSpec {
		return tensorSpec{name: name, shape: []uint64{n}, typ: F32, init: initUniform, sigma: sigmaBias}
	}
	emb := tensorSpec{name: "token_embd.weight", shape: []uint64{h, uint64(vocab)}, typ: o.Type, init: initUniform, sigma: sigmaEmbed}
	if o.Tied {
		emb.sigma = 1 / math.Sqrt(float64(h)) // it is the output projection too
	}
	ts := []tensorSpec{emb, ones("output_norm.weight", h)}
	if !o.Tied {
		ts = append(ts, w("output.weight", h, uint64(vocab)))
	}
	for i := range o.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		ts = append(ts, ones(p+"attn_norm.weight", h),
			w(p+"attn_q.weight", h, h), w(p+"attn_k.weight", h, kv), w(p+"attn_v.weight", h, kv))
		if qkvBias {
			ts = append(ts, bias(p+"attn_q.bias", h), bias(p+"attn_k.bias", kv), bias(p+"attn_v.bias", kv))
		}
		// The projections back into the residual stream are scaled down
		// by √(2·layers) so the stream's scale stays O(1) at any depth.
		ao, fd := w(p+"attn_output.weight", h, h), w(p+"ffn_down.weight", ff, h)
		ao.sigma /= math.Sqrt(float64(2 * o.Layers))
		fd.sigma /= math.Sqrt(float64(2 * o.Layers))
		ts = append(ts, ao,
			ones(p+"ffn_norm.weight", h),
			w(p+"ffn_gate.weight", h, ff), w(p+"ffn_up.weight", h, ff), fd)
	}
	return ts
}

// Complete returns o with the defaults filled in: the arch's rope theta
// and RMS epsilon where they are 0, and a Name where it is empty. An
// unknown arch is left for Validate to report.
func (o RandomOptions) Complete() RandomOptions {
	if a, ok := archs[o.Arch]; ok {
		if o.RopeTheta == 0 {
			o.RopeTheta = a.ropeTheta
		}
		if o.RMSEps == 0 {
			o.RMSEps = a.rmsEps
		}
	}
	if o.Name == "" {
		o.Name = fmt.Sprintf("random-%s-%dx%d", o.Arch, o.Layers, o.Hidden)
	}
	return o
}

// Validate checks completed options (see Complete): a known arch, sizes in
// range, a type that can hold the shapes. It does not open the vocab.
func (o RandomOptions) Validate() error {
	var errs []error
	if _, ok := archs[o.Arch]; !ok {
		errs = append(errs, fmt.Errorf("unknown arch %q (have %s)", o.Arch, strings.Join(Archs(), ", ")))
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"layers", o.Layers}, {"hidden", o.Hidden}, {"heads", o.Heads}, {"kv heads", o.KVHeads}, {"ffn", o.FFN}, {"context", o.Context}} {
		if f.v < 1 || f.v > math.MaxUint32 {
			errs = append(errs, fmt.Errorf("%s = %d, want 1 to %d", f.name, f.v, uint32(math.MaxUint32)))
		}
	}
	if len(errs) == 0 {
		if o.Hidden%o.Heads != 0 {
			errs = append(errs, fmt.Errorf("hidden %d is not a multiple of heads %d", o.Hidden, o.Heads))
		} else if (o.Hidden/o.Heads)%2 != 0 {
			errs = append(errs, fmt.Errorf("head size %d (hidden/heads) is odd; RoPE needs it even", o.Hidden/o.Heads))
		}
		if o.Heads%o.KVHeads != 0 {
			errs = append(errs, fmt.Errorf("kv heads %d does not divide heads %d", o.KVHeads, o.Heads))
		}
	}
	switch {
	case !o.Type.Encodable():
		errs = append(errs, fmt.Errorf("type %v cannot be written (F32, F16, Q8_0 can)", o.Type))
	case o.Type == Q8_0 && (o.Hidden%q8Block != 0 || o.FFN%q8Block != 0):
		errs = append(errs, fmt.Errorf("type Q8_0 needs hidden and ffn to be multiples of %d, got %d and %d", q8Block, o.Hidden, o.FFN))
	}
	if !(o.RopeTheta > 0 && o.RopeTheta <= math.MaxFloat32) {
		errs = append(errs, fmt.Errorf("rope theta %g out of range (0, %g]", o.RopeTheta, math.MaxFloat32))
	}
	if !(o.RMSEps > 0 && o.RMSEps < 1) {
		errs = append(errs, fmt.Errorf("rms eps %g out of range (0, 1)", o.RMSEps))
	}
	if o.Vocab == "" {
		errs = append(errs, errors.New("no vocab GGUF given"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("gguf: random model: %w", err)
	}
	return nil
}

// resolveVocab returns the path of the options' vocab file.
func (o RandomOptions) resolveVocab() (string, error) {
	if _, err := os.Stat(o.Vocab); err == nil || strings.ContainsRune(o.Vocab, filepath.Separator) || strings.ContainsRune(o.Vocab, '/') {
		return o.Vocab, nil
	}
	dir, err := VocabDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, o.Vocab), nil
}

// RandomModel returns the metadata and tensors of a random-weight model for
// o. Reading the vocab is the only I/O; the tensors' values are drawn as
// Write asks for them, so the whole model is never in memory. The weights
// are random: the model runs in llama.cpp like the real architecture but
// its output is gibberish.
func RandomModel(o RandomOptions) (Metadata, []Tensor, error) {
	o = o.Complete()
	if err := o.Validate(); err != nil {
		return nil, nil, err
	}
	arch := archs[o.Arch]
	path, err := o.resolveVocab()
	if err != nil {
		return nil, nil, err
	}
	vf, err := ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("gguf: random model: vocab: %w", err)
	}
	tokens, err := Lookup[[]string](vf.Metadata, KeyTokens)
	if err != nil {
		return nil, nil, fmt.Errorf("gguf: random model: vocab %s: %w", path, err)
	}
	if len(tokens) == 0 || len(tokens) > math.MaxInt32 {
		return nil, nil, fmt.Errorf("gguf: random model: vocab %s: %d tokens", path, len(tokens))
	}

	ft, _ := o.Type.FileType()
	a := o.Arch + "."
	meta := Metadata{
		{KeyArchitecture, o.Arch},
		{KeyName, o.Name},
		{"general.description", fmt.Sprintf("random weights (seed %d), gibberish output; tokenizer of %s", o.Seed, filepath.Base(path))},
		{KeyFileType, ft},
	}
	if o.Type == Q8_0 {
		meta = append(meta, KV{KeyQuantizationVersion, uint32(2)})
	}
	meta = append(meta,
		KV{a + "vocab_size", uint32(len(tokens))},
		KV{a + "context_length", uint32(o.Context)},
		KV{a + "embedding_length", uint32(o.Hidden)},
		KV{a + "block_count", uint32(o.Layers)},
		KV{a + "feed_forward_length", uint32(o.FFN)},
		KV{a + "attention.head_count", uint32(o.Heads)},
		KV{a + "attention.head_count_kv", uint32(o.KVHeads)},
		KV{a + "rope.dimension_count", uint32(o.Hidden / o.Heads)},
		KV{a + "rope.freq_base", float32(o.RopeTheta)},
		KV{a + "attention.layer_norm_rms_epsilon", float32(o.RMSEps)},
	)
	for _, kv := range vf.Metadata {
		if strings.HasPrefix(kv.Key, "tokenizer.") {
			meta = append(meta, kv)
		}
	}

	specs := arch.tensors(&o, len(tokens))
	tensors := make([]Tensor, len(specs))
	for i, s := range specs {
		tensors[i] = Tensor{
			TensorInfo: TensorInfo{Name: s.name, Shape: s.shape, Type: s.typ},
			Fill:       s.filler(o.Seed),
		}
	}
	return meta, tensors, nil
}

// WriteRandom writes the random-weight model of o to path (see
// RandomModel and WriteFile).
func WriteRandom(path string, o RandomOptions) error {
	meta, tensors, err := RandomModel(o)
	if err != nil {
		return err
	}
	return WriteFile(path, meta, tensors)
}

// filler returns the Fill function of a tensor. Value i of a uniform
// tensor depends only on the seed, the tensor's name and i (a counter-based
// generator), so the output does not depend on how Write chunks the work.
func (s tensorSpec) filler(seed uint64) func([]float32, uint64) error {
	if s.init == initOnes {
		return func(dst []float32, _ uint64) error {
			for i := range dst {
				dst[i] = 1
			}
			return nil
		}
	}
	h := fnv.New64a()
	h.Write([]byte(s.name))
	key := splitmix64(seed ^ h.Sum64())
	// A uniform int32 scaled by a/2³¹ lies in [-a, a) with a = √3σ.
	scale := float32(math.Sqrt(3) * s.sigma / (1 << 31))
	return func(dst []float32, first uint64) error {
		fillUniform(dst, first, key, scale)
		return nil
	}
}

// fillUniform stores values [first, first+len(dst)) of the uniform tensor
// of the given key: values 2k and 2k+1 are the low and high halves of hash
// k, as int32s times scale.
//
// It touches only dst; go:norace keeps the race detector from checking
// each store, which made generating a model with -race several times
// slower.
//
//go:norace
func fillUniform(dst []float32, first, key uint64, scale float32) {
	j := 0
	if first&1 == 1 && len(dst) > 0 {
		dst[0] = float32(int32(splitmix64(key+first>>1*0x9e3779b97f4a7c15)>>32)) * scale
		j = 1
	}
	for ; j+1 < len(dst); j += 2 {
		r := splitmix64(key + (first+uint64(j))>>1*0x9e3779b97f4a7c15)
		dst[j] = float32(int32(r)) * scale
		dst[j+1] = float32(int32(r>>32)) * scale
	}
	if j < len(dst) {
		dst[j] = float32(int32(splitmix64(key+(first+uint64(j))>>1*0x9e3779b97f4a7c15))) * scale
	}
}

// splitmix64 is the finaliser of SplitMix64: a bijective 64-bit mix.
func splitmix64(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
