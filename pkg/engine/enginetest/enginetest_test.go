package enginetest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/enginetest"
	"github.com/pdserve/pdserve/pkg/engine/ref"
)

func newRef(t *testing.T) *ref.Engine {
	e, err := ref.New(ref.Options{Preset: "tiny", Seed: 1, Threads: 2})
	if err != nil {
		t.Fatalf("ref.New: %v", err)
	}
	t.Cleanup(e.Close)
	return e
}

// faulty wraps an engine and breaks one part of the contract.
type faulty struct {
	engine.Engine
	fault string
}

func (f *faulty) Len(seq engine.SeqID) (int, error) {
	n, err := f.Engine.Len(seq)
	if f.fault == "len-off-by-one" && err == nil {
		n++
	}
	return n, err
}

func (f *faulty) Prefill(ctx context.Context, batch []engine.PrefillItem, onKV engine.KVFunc) ([]engine.Output, error) {
	if f.fault == "ignore-ctx" {
		ctx = context.Background()
	}
	if f.fault == "seed-ignored" || f.fault == "penalties-ignored" {
		batch = append([]engine.PrefillItem(nil), batch...)
		for i := range batch {
			batch[i].Sampling.Seed, batch[i].Sampling.Penalties = f.strip(batch[i].Sampling)
		}
	}
	if onKV != nil {
		inner := onKV
		onKV = func(c engine.KVChunk) error {
			switch f.fault {
			case "kv-skip-last-layer":
				if c.Layer == f.Spec().Layers-1 {
					return nil
				}
			case "kv-short-data":
				c.Data = c.Data[:len(c.Data)-1]
			case "kv-error-swallowed":
				inner(c)
				return nil
			}
			return inner(c)
		}
	}
	outs, err := f.Engine.Prefill(ctx, batch, onKV)
	if f.fault == "all-logits-rows-swapped" {
		for i := range outs {
			if v := f.Spec().Vocab; len(outs[i].AllLogits) >= 2*v {
				rows := slices.Clone(outs[i].AllLogits)
				copy(rows, outs[i].AllLogits[v:2*v])
				copy(rows[v:], outs[i].AllLogits[:v])
				outs[i].AllLogits = rows
			}
		}
	}
	return outs, err
}

// strip returns s's seed and penalties less what the fault drops.
func (f *faulty) strip(s engine.Sampling) (uint64, *engine.Penalties) {
	switch f.fault {
	case "seed-ignored":
		return 0, s.Penalties
	case "penalties-ignored":
		return s.Seed, nil
	}
	return s.Seed, s.Penalties
}

func (f *faulty) Fork(src, dst engine.SeqID, n int) error {
	if f.fault == "fork-one-short" && n > 0 {
		n--
	}
	if err := f.Engine.(engine.Forker).Fork(src, dst, n); err != nil {
		return err
	}
	if f.fault == "fork-frees-source" {
		f.Engine.Free(src)
	}
	return nil
}

func (f *faulty) Decode(ctx context.Context, batch []engine.DecodeItem) ([]engine.Output, error) {
	if f.fault == "ignore-ctx" {
		ctx = context.Background()
	}
	if f.fault == "seed-ignored" || f.fault == "penalties-ignored" {
		batch = append([]engine.DecodeItem(nil), batch...)
		for i := range batch {
			batch[i].Sampling.Seed, batch[i].Sampling.Penalties = f.strip(batch[i].Sampling)
		}
	}
	outs, err := f.Engine.Decode(ctx, batch)
	switch {
	case f.fault == "errors-unwrapped" && err != nil:
		return nil, errors.New(err.Error())
	case f.fault == "decode-reversed" && len(outs) > 1:
		for i, j := 0, len(outs)-1; i < j; i, j = i+1, j-1 {
			outs[i], outs[j] = outs[j], outs[i]
		}
	}
	return outs, err
}

func (f *faulty) ExportKV(seq engine.SeqID, layer, start, end int, dst []byte) ([]byte, error) {
	n := len(dst)
	out, err := f.Engine.ExportKV(seq, layer, start, end, dst)
	if f.fault == "export-flips-a-bit" && err == nil && len(out) > n {
		out[n] ^= 0x40
	}
	return out, err
}

// TestFaultyEngine runs the suite against a broken engine; it is run by
// TestSuiteDetectsFaults in a child process, which expects it to fail.
func TestFaultyEngine(t *testing.T) {
	fault := os.Getenv("ENGINETEST_FAULT")
	if fault == "" {
		t.Skip("run by TestSuiteDetectsFaults")
	}
	switch fault {
	case "noise-over-tolerance":
		enginetest.Run(t, func(t *testing.T) engine.Engine { return &noisy{Engine: newRef(t), amp: 3 * noiseTol} }, enginetest.LogitTolerance(noiseTol))
	case "noisy-seed-ignored":
		enginetest.Run(t, func(t *testing.T) engine.Engine {
			return &faulty{Engine: &noisy{Engine: newRef(t), amp: noiseTol / 2}, fault: "seed-ignored"}
		}, enginetest.LogitTolerance(noiseTol))
	default:
		enginetest.Run(t, func(t *testing.T) engine.Engine { return &faulty{Engine: newRef(t), fault: fault} })
	}
}

// TestSuiteDetectsFaults checks that the suite can fail: each fault must
// make the named subtest fail.
func TestSuiteDetectsFaults(t *testing.T) {
	if os.Getenv("ENGINETEST_FAULT") != "" {
		t.Skip("child process")
	}
	tests := []struct{ fault, subtest string }{
		{"len-off-by-one", "PrefillThenDecode"},
		{"kv-skip-last-layer", "KVCallback"},
		{"kv-short-data", "KVCallback"},
		{"kv-error-swallowed", "KVCallbackError"},
		{"seed-ignored", "SeededSampling"},
		{"errors-unwrapped", "BatchErrors"},
		{"decode-reversed", "BatchedDecode"},
		{"export-flips-a-bit", "ExportImport"},
		{"ignore-ctx", "Cancelled"},
		{"penalties-ignored", "Penalties"},
		{"all-logits-rows-swapped", "AllLogits"},
		{"fork-one-short", "Fork"},
		{"fork-frees-source", "Fork"},
		{"noise-over-tolerance", "BatchedDecode"},
		{"noise-over-tolerance", "ChunkedPrefill"},
		{"noisy-seed-ignored", "SeededSampling"},
	}
	for _, tc := range tests {
		t.Run(tc.fault, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run", "^TestFaultyEngine$/^"+tc.subtest+"$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "ENGINETEST_FAULT="+tc.fault)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("suite with fault %q: %v, want a failing exit\n%s", tc.fault, err, out)
			}
			if !regexp.MustCompile(`--- FAIL: TestFaultyEngine/` + tc.subtest + `\b`).Match(out) {
				t.Errorf("fault %q did not fail subtest %s:\n%s", tc.fault, tc.subtest, out)
			}
		})
	}
}

// TestHealthyEngine is the control: the unbroken wrapper passes.
func TestHealthyEngine(t *testing.T) {
	enginetest.Run(t, func(t *testing.T) engine.Engine { return &faulty{Engine: newRef(t)} })
}

// noiseTol is the logit tolerance the noisy engine is checked with: large
// against the tiny preset's logit gaps, so that near ties are common.
const noiseTol = 0.05

// noisy wraps an engine like llama.cpp's CPU backend: its logits move by
// up to amp with the shape of the batch (the number of items), the same
// for the same shape, and tokens are sampled from the moved logits.
type noisy struct {
	engine.Engine
	amp float32
}

func (n *noisy) Prefill(ctx context.Context, batch []engine.PrefillItem, onKV engine.KVFunc) ([]engine.Output, error) {
	outs, err := n.Engine.Prefill(ctx, batch, onKV)
	for i := range outs {
		if len(outs[i].AllLogits) > 0 {
			outs[i].AllLogits = n.move(outs[i].AllLogits, len(batch), outs[i].Seq)
		}
		if outs[i].Sampled {
			outs[i] = n.resample(outs[i], len(batch), batch[i].Sampling)
		}
	}
	return outs, err
}

func (n *noisy) Decode(ctx context.Context, batch []engine.DecodeItem) ([]engine.Output, error) {
	outs, err := n.Engine.Decode(ctx, batch)
	for i := range outs {
		outs[i] = n.resample(outs[i], len(batch), batch[i].Sampling)
	}
	return outs, err
}

func (n *noisy) Fork(src, dst engine.SeqID, k int) error {
	return n.Engine.(engine.Forker).Fork(src, dst, k)
}

// resample moves o's logits and draws its token again from them, at the
// position the sequence has reached.
func (n *noisy) resample(o engine.Output, shape int, s engine.Sampling) engine.Output {
	if o.Logits == nil {
		return o
	}
	o.Logits = n.move(o.Logits, shape, o.Seq)
	pos, err := n.Engine.Len(o.Seq)
	if err == nil {
		o.Token = engine.Sample(o.Logits, s, pos, nil)
	}
	return o
}

// move returns a copy of logits, each moved by a value in [-amp, amp]
// fixed by the batch shape and the token (not by the sequence: the same
// context in the same shape computes the same).
func (n *noisy) move(logits []float32, shape int, _ engine.SeqID) []float32 {
	out := slices.Clone(logits)
	if shape == 1 {
		return out // one sequence alone: the reference computation
	}
	for i := range out {
		h := uint32(i)*2654435761 ^ uint32(shape)*40503
		h ^= h >> 15
		h *= 2246822519
		h ^= h >> 13
		out[i] += n.amp * (float32(h%2001)/1000 - 1)
	}
	return out
}

// TestNoisyEngine: an engine whose logits depend on the batch within the
// tolerance passes the suite run with that tolerance (while the faults
// noise-over-tolerance and noisy-seed-ignored fail it, above).
func TestNoisyEngine(t *testing.T) {
	enginetest.Run(t, func(t *testing.T) engine.Engine { return &noisy{Engine: newRef(t), amp: noiseTol / 2} }, enginetest.LogitTolerance(noiseTol))
}
