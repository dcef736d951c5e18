package decode

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
)

// eogTokenizer adds end-of-generation ids to a tokenizer (as llama.cpp's
// EOT or <|im_end|>).
type eogTokenizer struct {
	engine.Tokenizer
	extra []int32
}

var _ engine.EOGTokenizer = eogTokenizer{}

func (t eogTokenizer) EOG() []int32 { return append([]int32{t.EOS()}, t.extra...) }

// eogEngine is an engine whose tokenizer ends generation on extra ids too.
type eogEngine struct {
	engine.Engine
	tok eogTokenizer
}

func (e eogEngine) Tokenizer() engine.Tokenizer { return e.tok }

// Every end-of-generation token of the engine's tokenizer ends a sequence
// with "stop", as EOS does, locally prefilled or with remote KV (where the
// prefill worker's first token may be one); ignore_eos generates past them
// all.
func TestEOGTokensEndGeneration(t *testing.T) {
	p := prompt(11, 9)
	const max = 12
	full := reference(t, p, max, engine.Sampling{}) // generated past every EOG
	eos := newEngine(t).Tokenizer().EOS()
	tests := []struct {
		name      string
		extraAt   int // the extra EOG id is full[extraAt]
		remote    bool
		ignoreEOS bool
	}{
		{"local prefill, extra eog mid-output", 4, false, false},
		{"local prefill, extra eog first", 0, false, false},
		{"remote kv, extra eog mid-output", 4, true, false},
		{"remote kv, the prefill's first token is an extra eog", 0, true, false},
		{"ignore_eos generates past it", 4, false, true},
		{"ignore_eos with remote kv", 0, true, true},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			extra := full[tc.extraAt]
			if extra == eos {
				t.Fatalf("reference token %d is EOS already; pick another position", tc.extraAt)
			}
			want, reason := full, FinishLength
			if !tc.ignoreEOS {
				n := slices.IndexFunc(full, func(x int32) bool { return x == extra || x == eos })
				want, reason = full[:n+1], FinishStop // the ending token is streamed last
			}
			if tc.remote {
				want = want[1:] // position 0 is the prefill worker's to carry
			}
			eng := eogEngine{Engine: newEngine(t), tok: eogTokenizer{Tokenizer: newEngine(t).Tokenizer(), extra: []int32{extra}}}
			w := newWorkerOn(t, eng, smallOptions(), true)
			ctx := testCtx(t)
			id := fmt.Sprint("eog-", i)
			req := &pdservev1.GenerateRequest{RequestId: id, PromptTokens: p, MaxTokens: max, LocalPrefill: !tc.remote, IgnoreEos: tc.ignoreEOS}
			if tc.remote {
				if _, err := w.client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: id, Tokens: int32(len(p) + max)}); err != nil {
					t.Fatal(err)
				}
				if first := pushKV(t, w.addr, id, p, 4); first != full[0] {
					t.Fatalf("prefill's first token %d, reference %d", first, full[0])
				}
			}
			stream, err := w.client.Generate(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			got, err := collect(stream)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got.tokens, cmpopts.EquateEmpty()); diff != "" || got.reason != reason {
				t.Errorf("finish %q, want %q; tokens (-want +got):\n%s", got.reason, reason, diff)
			}
		})
	}
}
