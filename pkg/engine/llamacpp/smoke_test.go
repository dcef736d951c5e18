package llamacpp

import (
	"context"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
)

func TestSmoke(t *testing.T) {
	e := newTestEngine(t, "llama-f32", nil)
	t.Logf("spec %+v layout %+v", e.Spec(), e.lo)
	p := e.Tokenizer().Encode("The quick brown fox")
	outs, err := e.Prefill(context.Background(), []engine.PrefillItem{{Seq: 1, Tokens: p, Last: true}}, func(c engine.KVChunk) error {
		t.Logf("kv chunk layer %d [%d,%d) %d bytes", c.Layer, c.Start, c.End, len(c.Data))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	tok := outs[0].Token
	gen := []int32{tok}
	for range 10 {
		o, err := e.Decode(context.Background(), []engine.DecodeItem{{Seq: 1, Token: tok}})
		if err != nil {
			t.Fatal(err)
		}
		tok = o[0].Token
		gen = append(gen, tok)
	}
	t.Logf("gen %v %q used %d", gen, e.Tokenizer().Decode(gen), e.UsedCells())
}
