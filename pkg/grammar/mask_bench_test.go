package grammar

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// worstSchema is an array of an enum of DefaultLimits.Alternatives
// strings sharing a prefix as long as the literal bytes allow: every
// alternative a live parse stack for about 100 characters of each item.
func worstSchema() string {
	n := DefaultLimits.Alternatives
	prefix := strings.Repeat("x", DefaultLimits.LiteralBytes/n-8)
	vals := make([]string, n)
	for i := range vals {
		vals[i] = fmt.Sprintf("%q", fmt.Sprint(prefix, i))
	}
	return `{"type":"array","items":{"enum":[` + strings.Join(vals, ",") + `]}}`
}

// BenchmarkMaskWorst is one sequence's step under worstSchema inside an
// item, where every alternative is live, over the byte vocabulary: the
// mask, the check of one token and its acceptance.
//
//	go test -run '^$' -bench MaskWorst ./pkg/grammar/
func BenchmarkMaskWorst(b *testing.B) {
	gbnf, err := FromSchema([]byte(worstSchema()))
	if err != nil {
		b.Fatal(err)
	}
	g, err := Parse(gbnf, "root")
	if err != nil {
		b.Fatal(err)
	}
	v := NewVocab(tokenizer.Bytes{})
	t, err := v.Mask(g)
	if err != nil {
		b.Fatal(err)
	}
	if err := t.m.Accept([]byte(`["xxxxxxxxxx`)); err != nil {
		b.Fatal(err)
	}
	b.Logf("%d live stacks", len(t.m.stacks))
	logits := make([]float32, tokenizer.Vocab)
	b.ResetTimer()
	for range b.N {
		t.Mask(logits)
		if !t.Allows('x') {
			b.Fatal("x refused")
		}
		m := *t.m
		if err := m.Accept([]byte("x")); err != nil {
			b.Fatal(err)
		}
	}
}
