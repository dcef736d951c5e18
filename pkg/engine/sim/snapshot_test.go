package sim

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/engine"
)

// TestSnapshotRestore: a sequence restored from a snapshot (whole or a
// prefix of it) exports the bytes its source did, imported KV the engine
// cannot regenerate included, after the source is freed; a snapshot's
// layers render those bytes; it continues decoding as the source does;
// bad calls fail with the documented errors and change nothing.
func TestSnapshotRestore(t *testing.T) {
	e, _ := newSim(t, Options{Profile: "h100/llama-3-8b/tp1"})
	other, _ := newSim(t, Options{Profile: "h100/llama-3-8b/tp1", Seed: 77}) // another pattern
	spec := e.Spec()
	toks := seqTokens(12, 8)
	first := prefillOne(t, other, 1, toks)
	tb := spec.KVTokenBytes()
	r := rand.New(rand.NewPCG(5, 6))
	src := make([][]byte, spec.Layers)
	for l := range spec.Layers {
		data, err := other.ExportKV(1, l, 0, len(toks), nil)
		if err != nil {
			t.Fatal(err)
		}
		if l == 1 {
			for i := range data {
				data[i] = byte(r.Uint32())
			}
		}
		src[l] = data
		if err := e.ImportKV(1, l, 0, data); err != nil {
			t.Fatal(err)
		}
	}
	whole, err := e.SnapshotKV(1, len(toks))
	if err != nil {
		t.Fatal(err)
	}
	part, err := e.SnapshotKV(1, 7)
	if err != nil {
		t.Fatal(err)
	}
	e.Free(1)
	for l := range spec.Layers {
		got, err := e.SnapshotLayerKV(whole, l, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, src[l]) {
			t.Fatalf("layer %d: the snapshot renders other bytes than the source exported", l)
		}
	}
	for _, rs := range []struct {
		seq  engine.SeqID
		snap any
		n    int
	}{{2, whole, len(toks)}, {3, whole, 5}, {4, part, 7}, {5, part, 3}} {
		if err := e.RestoreKV(rs.seq, rs.snap, rs.n); err != nil {
			t.Fatalf("RestoreKV(%d, %d tokens): %v", rs.seq, rs.n, err)
		}
		if n, _ := e.Len(rs.seq); n != rs.n {
			t.Fatalf("restored seq %d holds %d tokens, want %d", rs.seq, n, rs.n)
		}
		for l := range spec.Layers {
			got, err := e.ExportKV(rs.seq, l, 0, rs.n, nil)
			if err != nil {
				t.Fatal(err)
			}
			if want := sliceTokens(src[l], len(toks), 0, rs.n, tb); !bytes.Equal(got, want) {
				t.Fatalf("seq %d (%d tokens) layer %d: export differs from the source's", rs.seq, rs.n, l)
			}
		}
	}
	if diff := cmp.Diff(decodeN(t, other, 1, first, 6), decodeN(t, e, 2, first, 6)); diff != "" {
		t.Errorf("the restored sequence continues differently from the source (-source +restored):\n%s", diff)
	}

	if err := e.RestoreKV(2, whole, 3); !errors.Is(err, engine.ErrDuplicateSeq) {
		t.Errorf("RestoreKV into a live seq: %v, want ErrDuplicateSeq", err)
	}
	if err := e.RestoreKV(9, part, 8); !errors.Is(err, engine.ErrRange) {
		t.Errorf("RestoreKV of more tokens than the snapshot holds: %v, want ErrRange", err)
	}
	otherSnap, err := other.SnapshotKV(1, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.RestoreKV(9, otherSnap, 4); err == nil {
		t.Error("RestoreKV of another generator's snapshot succeeded")
	}
	if err := e.RestoreKV(9, "not a snapshot", 0); err == nil {
		t.Error("RestoreKV of a string succeeded")
	}
	if _, err := e.Len(9); !errors.Is(err, engine.ErrUnknownSeq) {
		t.Errorf("a failed restore left seq 9: Len = %v", err)
	}
	if _, err := e.SnapshotKV(9, 1); !errors.Is(err, engine.ErrUnknownSeq) {
		t.Errorf("SnapshotKV of an unknown seq: %v, want ErrUnknownSeq", err)
	}
	if _, err := e.SnapshotKV(3, 6); !errors.Is(err, engine.ErrRange) {
		t.Errorf("SnapshotKV beyond the sequence: %v, want ErrRange", err)
	}
	if _, err := e.SnapshotLayerKV(whole, spec.Layers, nil); !errors.Is(err, engine.ErrRange) {
		t.Errorf("SnapshotLayerKV of a layer out of range: %v, want ErrRange", err)
	}
}
