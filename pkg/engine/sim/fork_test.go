package sim

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/engine"
)

// TestForkKeepsForeignKV: a fork of a sequence holding imported KV that
// the engine cannot regenerate exports the same bytes for its prefix, and
// keeps them after the source is freed.
func TestForkKeepsForeignKV(t *testing.T) {
	e, _ := newSim(t, Options{Profile: "h100/llama-3-8b/tp1"})
	other, _ := newSim(t, Options{Profile: "h100/llama-3-8b/tp1", Seed: 77}) // another pattern
	spec := e.Spec()
	toks := seqTokens(12, 8)
	first := prefillOne(t, other, 1, toks)
	tb := spec.KVTokenBytes()
	r := rand.New(rand.NewPCG(3, 4))
	imported := make([][]byte, spec.Layers)
	for l := range spec.Layers {
		data, err := other.ExportKV(1, l, 0, len(toks), nil)
		if err != nil {
			t.Fatal(err)
		}
		if l == 2 {
			for i := range data {
				data[i] = byte(r.Uint32())
			}
		}
		imported[l] = data
		for _, rg := range [][2]int{{0, 5}, {5, len(toks)}} {
			if err := e.ImportKV(1, l, rg[0], sliceTokens(data, len(toks), rg[0], rg[1], tb)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, fk := range []struct {
		dst int
		n   int
	}{{2, 3}, {3, 7}, {4, len(toks)}} {
		if err := e.Fork(1, engine.SeqID(fk.dst), fk.n); err != nil {
			t.Fatalf("Fork(1, %d, %d): %v", fk.dst, fk.n, err)
		}
	}
	e.Free(1)
	for _, fk := range []struct {
		dst int
		n   int
	}{{2, 3}, {3, 7}, {4, len(toks)}} {
		for l := range spec.Layers {
			for _, rg := range [][2]int{{0, fk.n}, {fk.n / 2, fk.n}} {
				got, err := e.ExportKV(engine.SeqID(fk.dst), l, rg[0], rg[1], nil)
				if err != nil {
					t.Fatal(err)
				}
				if want := sliceTokens(imported[l], len(toks), rg[0], rg[1], tb); !bytes.Equal(got, want) {
					t.Fatalf("fork %d of %d tokens, layer %d [%d, %d): export differs from the imported bytes", fk.dst, fk.n, l, rg[0], rg[1])
				}
			}
		}
	}
	if diff := cmp.Diff(decodeN(t, other, 1, first, 6), decodeN(t, e, 4, first, 6)); diff != "" {
		t.Errorf("the whole-sequence fork continues differently from the source (-source +fork):\n%s", diff)
	}
}
