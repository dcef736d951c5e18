package enginecfg

import (
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/perfmodel"
)

func TestValidate(t *testing.T) {
	model := filepath.Join(t.TempDir(), "m.gguf")
	if err := os.WriteFile(model, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	llama := func(o Options) Options {
		o.Engine, o.Model = Llama, model
		return o
	}
	sim := func(o Options) Options {
		o.Engine = Sim
		o.Profile = perfmodel.Names()[0]
		return o
	}
	tests := []struct {
		name    string
		mod     func(o Options) Options
		wantErr string // substring; "" means valid
	}{
		{"defaults", func(o Options) Options { return o }, ""},
		{"small preset", func(o Options) Options { o.Preset = "small"; return o }, ""},
		{"unknown engine", func(o Options) Options { o.Engine = "vllm"; return o }, "--engine vllm: must be ref, sim or llamacpp"},
		{"unknown preset", func(o Options) Options { o.Preset = "huge"; return o }, "--preset huge: must be one of "},
		{"negative threads", func(o Options) Options { o.Threads = -1; return o }, "--engine-threads -1: must not be negative"},
		{"sim", sim, ""},
		{"sim without profile", func(o Options) Options { o = sim(o); o.Profile = ""; return o }, "--profile is required with --engine sim"},
		{"sim unknown profile", func(o Options) Options { o = sim(o); o.Profile = "tpu/x/tp1"; return o }, "unknown profile"},
		{"sim zero time scale", func(o Options) Options { o = sim(o); o.TimeScale = 0; return o }, "--time-scale 0: must be a finite number > 0"},
		{"sim payload scale above 1", func(o Options) Options { o = sim(o); o.PayloadScale = 2; return o }, "--payload-scale 2: must lie in (0, 1]"},
		{"llamacpp", llama, ""},
		{"llamacpp without model", func(o Options) Options { o = llama(o); o.Model = ""; return o }, "--model is required with --engine llamacpp"},
		{"llamacpp missing model", func(o Options) Options { o = llama(o); o.Model = "/nonexistent.gguf"; return o }, "--model /nonexistent.gguf: no such file or directory"},
		{"llamacpp model directory", func(o Options) Options { o = llama(o); o.Model = filepath.Dir(model); return o }, "is a directory, not a GGUF file"},
		{"llamacpp kv type", func(o Options) Options { o = llama(o); o.KVType = "q4_0"; return o }, "--kv-type q4_0: must be f16 or q8_0"},
		{"llamacpp max seqs", func(o Options) Options { o = llama(o); o.MaxSeqs = 300; return o }, "--max-seqs 300: must lie in [1, 256]"},
		{"llamacpp ctx size", func(o Options) Options { o = llama(o); o.CtxSize = -1; return o }, "--ctx-size -1: must not be negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.mod(DefaultOptions()).Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Validate: %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("Validate: %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestValidateErrors: the problems keep their causes for errors.Is and
// print as one line each, the flag named once.
func TestValidateErrors(t *testing.T) {
	o := DefaultOptions()
	o.Engine, o.Model, o.MaxSeqs = Llama, filepath.Join(t.TempDir(), "m.gguf"), 0
	err := o.Validate()
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Validate: %v, want an error that is fs.ErrNotExist", err)
	}
	var out strings.Builder
	cliflags.PrintError(&out, "decode-worker", err)
	want := "decode-worker: --model " + o.Model + ": no such file or directory\n" +
		"decode-worker: --max-seqs 0: must lie in [1, 256]\n"
	if out.String() != want {
		t.Errorf("printed:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestFlags(t *testing.T) {
	o := DefaultOptions()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--engine=sim", "--profile=h100/llama-3-8b/tp1", "--time-scale=0.5", "--payload-scale=0.25", "--seed=7"}); err != nil {
		t.Fatal(err)
	}
	want := DefaultOptions()
	want.Engine, want.Seed, want.Profile, want.TimeScale, want.PayloadScale = Sim, 7, "h100/llama-3-8b/tp1", 0.5, 0.25
	if diff := cmp.Diff(want, o); diff != "" {
		t.Errorf("options (-want +got):\n%s", diff)
	}
}
