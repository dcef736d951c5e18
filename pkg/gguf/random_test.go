package gguf

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// vocabDir returns the llama.cpp vocab directory. Without it the test
// fails when CI=true and is skipped otherwise.
func vocabDir(t testing.TB) string {
	t.Helper()
	dir, err := VocabDir()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v (CI=true: the vocab GGUFs are required)", err)
		}
		t.Skipf("%v: run make llama to test against the real vocabularies", err)
	}
	return dir
}

// kvBytes returns the bytes of each metadata pair of the file at path, by
// key, as stored in the file.
func kvBytes(t *testing.T, path string) (*File, map[string][]byte) {
	t.Helper()
	f, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string][]byte, len(f.Metadata))
	for i, kv := range f.Metadata {
		out[kv.Key] = data[f.kvSpans[i][0]:f.kvSpans[i][1]]
	}
	return f, out
}

// TestVocabFilesRewriteIdentically reads every llama.cpp vocab GGUF and
// writes its metadata back: the bytes must be the file's, but for the
// version (a v2 file is rewritten as v3, the same layout).
func TestVocabFilesRewriteIdentically(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join(vocabDir(t), "ggml-vocab-*.gguf"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no vocab GGUFs: %v", err)
	}
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			want, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			f, err := Read(bytes.NewReader(want))
			if err != nil {
				t.Fatal(err)
			}
			if len(f.Tensors) != 0 {
				t.Skipf("%d tensors: not a vocab-only file", len(f.Tensors))
			}
			binary.LittleEndian.PutUint32(want[4:], Version)
			if got := writeBytes(t, f.Metadata, nil); !bytes.Equal(got, want) {
				t.Errorf("rewritten file differs: %d bytes, want %d", len(got), len(want))
			}
		})
	}
}

func shapeOptions(t *testing.T, name string, typ TensorType, seed uint64) RandomOptions {
	t.Helper()
	o, err := Shape(name)
	if err != nil {
		t.Fatal(err)
	}
	o.Type, o.Seed = typ, seed
	return o
}

func TestRandomModelMetadata(t *testing.T) {
	dir := vocabDir(t)
	tests := []struct {
		shape string
		typ   TensorType
		tied  bool
		vocab string
		bias  bool
	}{
		{"tiny-llama", Q8_0, false, "ggml-vocab-llama-spm.gguf", false},
		{"tiny-qwen2", F16, false, "ggml-vocab-qwen2.gguf", true},
		{"tiny-qwen2", F32, true, "ggml-vocab-qwen2.gguf", true},
	}
	for _, tt := range tests {
		t.Run(tt.shape+"/"+tt.typ.String(), func(t *testing.T) {
			o := shapeOptions(t, tt.shape, tt.typ, 7)
			o.Tied = tt.tied
			path := filepath.Join(t.TempDir(), "m.gguf")
			start := time.Now()
			if err := WriteRandom(path, o); err != nil {
				t.Fatal(err)
			}
			t.Logf("generated %s in %v", tt.shape, time.Since(start))

			f, got := kvBytes(t, path)
			vf, want := kvBytes(t, filepath.Join(dir, tt.vocab))
			tokens, err := Lookup[[]string](vf.Metadata, KeyTokens)
			if err != nil {
				t.Fatal(err)
			}

			// Every tokenizer key, in the vocab's order, byte for byte.
			var wantKeys, gotKeys []string
			for _, kv := range vf.Metadata {
				if strings.HasPrefix(kv.Key, "tokenizer.") {
					wantKeys = append(wantKeys, kv.Key)
					if !bytes.Equal(got[kv.Key], want[kv.Key]) {
						t.Errorf("%s: bytes differ from the vocab's", kv.Key)
					}
				}
			}
			for _, kv := range f.Metadata {
				if strings.HasPrefix(kv.Key, "tokenizer.") {
					gotKeys = append(gotKeys, kv.Key)
				}
			}
			if diff := cmp.Diff(wantKeys, gotKeys); diff != "" {
				t.Errorf("tokenizer keys (-vocab +model):\n%s", diff)
			}

			a := o.Arch + "."
			ft, _ := o.Type.FileType()
			wantMeta := map[string]any{
				KeyArchitecture:                        o.Arch,
				KeyName:                                o.Name,
				KeyFileType:                            ft,
				a + "vocab_size":                       uint32(len(tokens)),
				a + "context_length":                   uint32(o.Context),
				a + "embedding_length":                 uint32(o.Hidden),
				a + "block_count":                      uint32(o.Layers),
				a + "feed_forward_length":              uint32(o.FFN),
				a + "attention.head_count":             uint32(o.Heads),
				a + "attention.head_count_kv":          uint32(o.KVHeads),
				a + "rope.dimension_count":             uint32(o.Hidden / o.Heads),
				a + "rope.freq_base":                   float32(o.RopeTheta),
				a + "attention.layer_norm_rms_epsilon": float32(o.RMSEps),
			}
			for k, v := range wantMeta {
				if g, ok := f.Metadata.Get(k); !ok || !cmp.Equal(g, v) {
					t.Errorf("%s = %v (%T), want %v (%T)", k, g, g, v, v)
				}
			}

			// Tensors: names, shapes, types.
			h, ff, kv, vocab := uint64(o.Hidden), uint64(o.FFN), uint64(o.Hidden/o.Heads*o.KVHeads), uint64(len(tokens))
			type ti struct {
				Name  string
				Shape []uint64
				Type  TensorType
			}
			wantT := []ti{{"token_embd.weight", []uint64{h, vocab}, o.Type}, {"output_norm.weight", []uint64{h}, F32}}
			if !tt.tied {
				wantT = append(wantT, ti{"output.weight", []uint64{h, vocab}, o.Type})
			}
			for i := range o.Layers {
				p := "blk." + string(rune('0'+i)) + "."
				wantT = append(wantT, ti{p + "attn_norm.weight", []uint64{h}, F32},
					ti{p + "attn_q.weight", []uint64{h, h}, o.Type}, ti{p + "attn_k.weight", []uint64{h, kv}, o.Type}, ti{p + "attn_v.weight", []uint64{h, kv}, o.Type})
				if tt.bias {
					wantT = append(wantT, ti{p + "attn_q.bias", []uint64{h}, F32}, ti{p + "attn_k.bias", []uint64{kv}, F32}, ti{p + "attn_v.bias", []uint64{kv}, F32})
				}
				wantT = append(wantT, ti{p + "attn_output.weight", []uint64{h, h}, o.Type}, ti{p + "ffn_norm.weight", []uint64{h}, F32},
					ti{p + "ffn_gate.weight", []uint64{h, ff}, o.Type}, ti{p + "ffn_up.weight", []uint64{h, ff}, o.Type}, ti{p + "ffn_down.weight", []uint64{ff, h}, o.Type})
			}
			var gotT []ti
			for _, x := range f.Tensors {
				gotT = append(gotT, ti{x.Name, x.Shape, x.Type})
			}
			if diff := cmp.Diff(wantT, gotT); diff != "" {
				t.Errorf("tensors (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRandomWeights checks the stored weights against the generator: norms
// exactly 1, weights of the stated σ, Q8_0 within its bound of the float
// values, nothing non-finite.
func TestRandomWeights(t *testing.T) {
	vocabDir(t)
	o := shapeOptions(t, "tiny-llama", Q8_0, 3)
	meta, tensors, err := RandomModel(o)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := WriteFile(path, meta, tensors); err != nil {
		t.Fatal(err)
	}
	f, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	for i, tn := range tensors {
		n := tn.Elements()
		want := make([]float32, n)
		if err := tn.Fill(want, 0); err != nil {
			t.Fatal(err)
		}
		got, err := f.TensorFloat32(fd, f.Tensors[i])
		if err != nil {
			t.Fatal(err)
		}
		checkTensor(t, Tensor{TensorInfo: tn.TensorInfo, Values: want}, got)

		var sum, sq float64
		for _, v := range want {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("%s: non-finite value %g", tn.Name, v)
			}
			sum += float64(v)
			sq += float64(v) * float64(v)
		}
		mean, std := sum/float64(n), math.Sqrt(sq/float64(n))
		switch {
		case strings.HasSuffix(tn.Name, "norm.weight"):
			if mean != 1 || std != 1 {
				t.Errorf("%s: mean %g, rms %g; want all ones", tn.Name, mean, std)
			}
		case len(tn.Shape) == 2:
			sigma := 1 / math.Sqrt(float64(tn.Shape[0]))
			switch {
			case tn.Name == "token_embd.weight":
				sigma = sigmaEmbed
			case strings.HasSuffix(tn.Name, "attn_output.weight"), strings.HasSuffix(tn.Name, "ffn_down.weight"):
				sigma /= math.Sqrt(float64(2 * o.Layers))
			}
			if math.Abs(std/sigma-1) > 0.05 || math.Abs(mean) > 0.05*sigma {
				t.Errorf("%s: mean %g, σ %g; want 0, %g", tn.Name, mean, std, sigma)
			}
		}
	}
}

// TestRandomDeterministic: the same options give the same bytes, another
// seed other weights, and a Fill's values do not depend on the chunking.
func TestRandomDeterministic(t *testing.T) {
	vocabDir(t)
	sum := func(o RandomOptions) [32]byte {
		meta, tensors, err := RandomModel(o)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		if err := Write(h, meta, tensors); err != nil {
			t.Fatal(err)
		}
		return [32]byte(h.Sum(nil))
	}
	o := shapeOptions(t, "tiny-llama", F16, 1)
	a, b := sum(o), sum(o)
	o.Seed = 2
	c := sum(o)
	if a != b {
		t.Error("two models of the same options differ")
	}
	if a == c {
		t.Error("models of seeds 1 and 2 are identical")
	}

	_, tensors, err := RandomModel(o)
	if err != nil {
		t.Fatal(err)
	}
	emb := tensors[0]
	whole := make([]float32, emb.Elements())
	if err := emb.Fill(whole, 0); err != nil {
		t.Fatal(err)
	}
	part := make([]float32, 777)
	if err := emb.Fill(part, 12345); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(whole[12345:12345+777], part); diff != "" {
		t.Errorf("Fill from an odd offset (-whole +part):\n%s", diff)
	}
}

func TestRandomOptionsValidate(t *testing.T) {
	base := RandomOptions{Arch: "llama", Vocab: "v.gguf", Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Context: 256, Type: Q8_0}.Complete()
	if err := base.Validate(); err != nil {
		t.Fatalf("valid options: %v", err)
	}
	tests := []struct {
		name   string
		modify func(*RandomOptions)
		want   string
	}{
		{"unknown arch", func(o *RandomOptions) { o.Arch = "gpt9" }, `unknown arch "gpt9" (have llama, qwen2)`},
		{"no layers", func(o *RandomOptions) { o.Layers = 0 }, "layers = 0"},
		{"heads not dividing hidden", func(o *RandomOptions) { o.Heads = 5 }, "not a multiple of heads 5"},
		{"odd head size", func(o *RandomOptions) { o.Hidden, o.Heads, o.KVHeads = 96, 32, 32 }, "head size 3"},
		{"kv heads not dividing heads", func(o *RandomOptions) { o.KVHeads = 3 }, "kv heads 3 does not divide heads 4"},
		{"q8_0 ffn not whole blocks", func(o *RandomOptions) { o.FFN = 100 }, "multiples of 32"},
		{"unencodable type", func(o *RandomOptions) { o.Type = Q4_K }, "type Q4_K cannot be written"},
		{"no vocab", func(o *RandomOptions) { o.Vocab = "" }, "no vocab"},
		{"negative eps", func(o *RandomOptions) { o.RMSEps = -1 }, "rms eps"},
		{"zero theta", func(o *RandomOptions) { o.RopeTheta = 0 }, "rope theta"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := base
			tt.modify(&o)
			if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestShapes(t *testing.T) {
	for _, p := range Shapes() {
		if err := p.Options.Complete().Validate(); err != nil {
			t.Errorf("shape %s: %v", p.Name, err)
		}
		if o, err := Shape(p.Name); err != nil || !cmp.Equal(o, p.Options) {
			t.Errorf("Shape(%q) = %+v, %v", p.Name, o, err)
		}
	}
	o, _ := Shape("qwen2.5-0.5b")
	if o.Layers != 24 || o.Hidden != 896 || o.Heads != 14 || o.KVHeads != 2 || o.FFN != 4864 || o.Context != 32768 || o.RopeTheta != 1e6 {
		t.Errorf("qwen2.5-0.5b = %+v", o)
	}
	if _, err := Shape("gpt-5"); err == nil || !strings.Contains(err.Error(), "tiny-llama") {
		t.Errorf("Shape of an unknown name: %v, want the known names", err)
	}
}

func TestVocabDir(t *testing.T) {
	t.Run("missing", func(t *testing.T) {
		root := t.TempDir()
		if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		sub := filepath.Join(root, "a", "b")
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Chdir(sub)
		_, err := VocabDir()
		if !errors.Is(err, ErrNoVocab) || !strings.Contains(err.Error(), "make llama") {
			t.Errorf("VocabDir without the vocab: %v, want ErrNoVocab telling to run make llama", err)
		}
		o := shapeOptions(t, "tiny-llama", F16, 1)
		if err := WriteRandom(filepath.Join(root, "m.gguf"), o); !errors.Is(err, ErrNoVocab) {
			t.Errorf("WriteRandom without the vocab: %v, want ErrNoVocab", err)
		}
	})
	t.Run("present", func(t *testing.T) {
		dir := vocabDir(t)
		if !strings.HasSuffix(filepath.ToSlash(dir), VocabRelDir) {
			t.Errorf("VocabDir() = %s, want …/%s", dir, VocabRelDir)
		}
	})
}

// TestRandomModelVocabErrors: a vocab that is not a GGUF, or has no token
// list, fails with the path in the error.
func TestRandomModelVocabErrors(t *testing.T) {
	dir := t.TempDir()
	notGGUF := filepath.Join(dir, "not.gguf")
	if err := os.WriteFile(notGGUF, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	noTokens := filepath.Join(dir, "notokens.gguf")
	if err := WriteFile(noTokens, Metadata{{"general.architecture", "llama"}}, nil); err != nil {
		t.Fatal(err)
	}
	base := RandomOptions{Arch: "llama", Layers: 1, Hidden: 32, Heads: 2, KVHeads: 1, FFN: 32, Context: 64, Type: F32}
	for _, tt := range []struct{ vocab, want string }{
		{notGGUF, "invalid GGUF"},
		{noTokens, "tokenizer.ggml.tokens: key not found"},
		{filepath.Join(dir, "none.gguf"), "no such file"},
	} {
		o := base
		o.Vocab = tt.vocab
		_, _, err := RandomModel(o)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("RandomModel(vocab %s): %v, want an error containing %q", filepath.Base(tt.vocab), err, tt.want)
		}
	}
}

// BenchmarkRandomModel measures generating and encoding a tiny model over
// the 151936-token qwen2 vocab (reading the vocab included).
func BenchmarkRandomModel(b *testing.B) {
	vocabDir(b)
	for _, typ := range []TensorType{F16, Q8_0} {
		b.Run(typ.String(), func(b *testing.B) {
			o, err := Shape("tiny-qwen2")
			if err != nil {
				b.Fatal(err)
			}
			o.Type = typ
			for b.Loop() {
				meta, tensors, err := RandomModel(o)
				if err != nil {
					b.Fatal(err)
				}
				if err := Write(io.Discard, meta, tensors); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
