package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/gguf"
)

// mkgguf is the whole command after signal handling. args are the
// arguments without the program name. It returns the exit code: 0 after
// writing the model or --help, 2 for bad flags or options, 1 when
// generating or writing failed (or ctx was cancelled; no partial file is
// left at --out).
func mkgguf(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mkgguf", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var shape, typ, out string
	shapeNames := make([]string, 0, len(gguf.Shapes()))
	for _, p := range gguf.Shapes() {
		shapeNames = append(shapeNames, p.Name)
	}
	fs.StringVar(&shape, "shape", "", "preset shape to start from: "+strings.Join(shapeNames, ", ")+"; other flags override it")
	fs.StringVar(&out, "out", "", "path of the GGUF file to write (required)")
	arch := fs.String("arch", "", "llama.cpp architecture: "+strings.Join(gguf.Archs(), ", "))
	vocab := fs.String("vocab", "", "vocab GGUF whose tokenizer.* keys are copied; a bare name is looked up in "+gguf.VocabRelDir)
	name := fs.String("name", "", "general.name (default random-<arch>-<layers>x<hidden>, or the shape's)")
	layers := fs.Int("layers", 0, "transformer blocks")
	hidden := fs.Int("hidden", 0, "embedding length, a multiple of --heads")
	heads := fs.Int("heads", 0, "attention heads")
	kvHeads := fs.Int("kv-heads", 0, "key/value heads, dividing --heads (default --heads)")
	ffn := fs.Int("ffn", 0, "feed-forward inner size")
	ctxLen := fs.Int("ctx", 2048, "training context length in tokens")
	fs.StringVar(&typ, "type", "f16", "type of the 2-D weights: f32, f16 or q8_0 (norms and biases are f32)")
	seed := fs.Uint64("seed", 1, "random seed; the same flags and seed give the same file")
	rope := fs.Float64("rope-theta", 0, "RoPE frequency base (default: the arch's, 1e4 llama, 1e6 qwen2)")
	eps := fs.Float64("rms-eps", 0, "RMSNorm epsilon (default: the arch's, 1e-5 llama, 1e-6 qwen2)")
	tied := fs.Bool("tied", false, "leave out output.weight so llama.cpp reuses token_embd.weight as the output")
	cliflags.AddVersion(fs)

	// fromFlag sets the field of each flag, applied only when it is given.
	fromFlag := map[string]func(*gguf.RandomOptions){}
	fromFlag["arch"] = func(o *gguf.RandomOptions) { o.Arch = *arch }
	fromFlag["vocab"] = func(o *gguf.RandomOptions) { o.Vocab = *vocab }
	fromFlag["name"] = func(o *gguf.RandomOptions) { o.Name = *name }
	fromFlag["layers"] = func(o *gguf.RandomOptions) { o.Layers = *layers }
	fromFlag["hidden"] = func(o *gguf.RandomOptions) { o.Hidden = *hidden }
	fromFlag["heads"] = func(o *gguf.RandomOptions) { o.Heads = *heads }
	fromFlag["kv-heads"] = func(o *gguf.RandomOptions) { o.KVHeads = *kvHeads }
	fromFlag["ffn"] = func(o *gguf.RandomOptions) { o.FFN = *ffn }
	fromFlag["ctx"] = func(o *gguf.RandomOptions) { o.Context = *ctxLen }
	fromFlag["seed"] = func(o *gguf.RandomOptions) { o.Seed = *seed }
	fromFlag["rope-theta"] = func(o *gguf.RandomOptions) { o.RopeTheta = *rope }
	fromFlag["rms-eps"] = func(o *gguf.RandomOptions) { o.RMSEps = *eps }
	fromFlag["tied"] = func(o *gguf.RandomOptions) { o.Tied = *tied }

	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: mkgguf [--shape NAME | --arch ARCH --vocab FILE --layers N --hidden N --heads N --ffn N] [flags] --out FILE\n\n"+
			"Writes a GGUF model with random weights of a real llama.cpp architecture over\n"+
			"the real tokenizer of a vocab GGUF, to test and benchmark llama.cpp without\n"+
			"pretrained weights. Its output is gibberish.\n\nShapes:\n")
		for _, p := range gguf.Shapes() {
			fmt.Fprintf(fs.Output(), "  %-13s %s\n", p.Name, p.Summary)
		}
		fmt.Fprintf(fs.Output(), "\nFlags:\n")
		fs.PrintDefaults()
	}
	if code, ok := cliflags.Parse(fs, args, stdout, stderr); !ok {
		return code
	}

	// Start from the shape (or from scratch), then apply the flags given.
	o := gguf.RandomOptions{Context: *ctxLen, Seed: *seed}
	if shape != "" {
		var err error
		if o, err = gguf.Shape(shape); err != nil {
			fmt.Fprintf(stderr, "mkgguf: --shape: %v\n", err)
			return 2
		}
		o.Seed = *seed
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) {
		set[fl.Name] = true
		if apply, ok := fromFlag[fl.Name]; ok {
			apply(&o)
		}
	})
	if shape == "" || set["type"] {
		t, err := gguf.ParseTensorType(typ)
		if err != nil {
			fmt.Fprintf(stderr, "mkgguf: --type: %v\n", err)
			return 2
		}
		o.Type = t
	}
	if shape == "" && !set["kv-heads"] {
		o.KVHeads = o.Heads
	}
	if out == "" {
		fmt.Fprintf(stderr, "mkgguf: --out is required (run with --help)\n")
		return 2
	}
	if shape == "" {
		var missing []string
		for _, fl := range []string{"arch", "vocab", "layers", "hidden", "heads", "ffn"} {
			if !set[fl] {
				missing = append(missing, "--"+fl)
			}
		}
		if len(missing) > 0 {
			fmt.Fprintf(stderr, "mkgguf: without --shape, %s must be set (run with --help)\n", strings.Join(missing, ", "))
			return 2
		}
	}
	o = o.Complete()
	if err := o.Validate(); err != nil {
		fmt.Fprintf(stderr, "mkgguf: %v\n", err)
		return 2
	}
	fmt.Fprintf(stderr, "mkgguf: %s\n", describe(o))

	start := time.Now()
	meta, tensors, err := gguf.RandomModel(o)
	if err != nil {
		fmt.Fprintf(stderr, "mkgguf: %v\n", err)
		if errors.Is(err, gguf.ErrNoVocab) {
			return 2
		}
		return 1
	}
	var params uint64
	for i := range tensors {
		params += tensors[i].Elements()
		fill := tensors[i].Fill
		tensors[i].Fill = func(dst []float32, first uint64) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			return fill(dst, first)
		}
	}
	if err := gguf.WriteFile(out, meta, tensors); err != nil {
		fmt.Fprintf(stderr, "mkgguf: %v\n", err)
		return 1
	}
	st, err := os.Stat(out)
	if err != nil {
		fmt.Fprintf(stderr, "mkgguf: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s: %d tensors, %d parameters, %d bytes, in %v\n",
		out, len(tensors), params, st.Size(), time.Since(start).Round(time.Millisecond))
	return 0
}

// describe renders the effective options on one line.
func describe(o gguf.RandomOptions) string {
	return fmt.Sprintf("arch=%s vocab=%s name=%q layers=%d hidden=%d heads=%d kv-heads=%d ffn=%d ctx=%d type=%v seed=%d rope-theta=%g rms-eps=%g tied=%t",
		o.Arch, o.Vocab, o.Name, o.Layers, o.Hidden, o.Heads, o.KVHeads, o.FFN, o.Context, o.Type, o.Seed, o.RopeTheta, o.RMSEps, o.Tied)
}
