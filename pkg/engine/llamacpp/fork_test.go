package llamacpp

import (
	"context"
	"errors"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
)

// TestForkSharesCells: a fork takes a slot but no KV cells (llama.cpp's
// unified cache shares the prefix), its own tokens take new cells, and
// freeing the source and the fork gives every cell back.
func TestForkSharesCells(t *testing.T) {
	e := newTestEngine(t, "llama-f32", func(o *Options) { o.MaxSeqs = 3 })
	ctx := context.Background()
	p := e.Tokenizer().Encode("The quick brown fox jumps over the lazy dog")
	if _, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: 1, Tokens: p, Last: true}}, nil); err != nil {
		t.Fatal(err)
	}
	before := e.llamaCells(t)
	if err := e.Fork(1, 2, len(p)); err != nil {
		t.Fatalf("Fork: %v", err)
	}
	if err := e.Fork(1, 3, 4); err != nil {
		t.Fatalf("Fork: %v", err)
	}
	if got := e.llamaCells(t); got != before {
		t.Errorf("forks took cells: %d distinct cells, %d before", got, before)
	}
	if got, want := e.UsedCells(), 2*len(p)+4; got != want {
		t.Errorf("UsedCells = %d, want %d (a shared prefix counts once per sequence)", got, want)
	}
	// Every slot is taken.
	err := e.Fork(1, 4, 1)
	if !errors.Is(err, ErrNoSlot) {
		t.Errorf("Fork with no free slot: %v, want ErrNoSlot", err)
	}
	if _, err := e.Len(4); !errors.Is(err, engine.ErrUnknownSeq) {
		t.Errorf("Len of the refused fork: %v, want ErrUnknownSeq", err)
	}
	if _, err := e.Decode(ctx, []engine.DecodeItem{{Seq: 2, Token: 5}, {Seq: 3, Token: 6}}); err != nil {
		t.Fatal(err)
	}
	if got := e.llamaCells(t); got != before+2 {
		t.Errorf("after one decode step of each fork: %d distinct cells, want %d", got, before+2)
	}
	for _, s := range []engine.SeqID{1, 2, 3} {
		e.Free(s)
	}
	if got := e.UsedCells(); got != 0 {
		t.Errorf("UsedCells after freeing all = %d, want 0", got)
	}
}

// llamaCells returns the number of distinct cells llama.cpp holds: the
// cells of the whole cache's state (seq id -1 is every sequence).
func (e *Engine) llamaCells(t *testing.T) int {
	t.Helper()
	b, err := e.stateOf(-1)
	if err != nil {
		t.Fatal(err)
	}
	r := &reader{b: b}
	r.u32()
	r.u32()
	n := 0
	for range r.u32() {
		n += int(r.u32())
		break // the unified cache: one stream
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	return n
}
