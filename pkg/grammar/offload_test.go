package grammar_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/grammar"
)

// offloadSchemas are grammars whose offloaded states are compared with
// the Go mask: a schema's, a large enum sharing a prefix, and one of
// multi-byte characters that a byte vocabulary splits.
func offloadGrammars(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{"json object": grammar.JSONObject, "utf-8": `root ::= "«" [α-ω]+ "»" | "é"{2,5}`}
	for name, schema := range map[string]string{
		"object": `{"type":"object","properties":{"color":{"enum":["red","green"]},"ok":{"type":"boolean"},"n":{"type":"number"}},"required":["color","ok"]}`,
		"enum":   `{"type":"array","items":{"enum":["xxxxxxxx1","xxxxxxxx22","xxxxxxxy","xx"]}}`,
	} {
		g, err := grammar.FromSchema([]byte(schema))
		if err != nil {
			t.Fatal(err)
		}
		out[name] = g
	}
	return out
}

func tinyEngine(t *testing.T) *ref.Engine {
	t.Helper()
	e, err := ref.New(ref.Options{Preset: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// An Offloaded state masks, allows and completes as the Go mask does
// over the same tokens, whether its states are computed on the Offload,
// shared with other choices, or here: walks of random allowed tokens,
// several choices of one compiled grammar at once.
func TestOffloadedMatchesTokenMask(t *testing.T) {
	e := tinyEngine(t)
	src := grammar.ForEngine(e)
	vocab := e.Tokenizer().Vocab()
	o := grammar.NewOffload(2, nil)
	for name, gbnf := range offloadGrammars(t) {
		t.Run(name, func(t *testing.T) {
			c, err := src.Compile(gbnf)
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			for choice := range 4 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(choice), 1))
					st, err := c.Offloaded(o, uint64(choice%2), nil)
					if err != nil {
						t.Error(err)
						return
					}
					defer st.Close()
					want, err := src.Constrain(gbnf, nil)
					if err != nil {
						t.Error(err)
						return
					}
					got := make([]float32, vocab+3)
					exp := make([]float32, vocab+3)
					for step := range 60 {
						clear(got)
						clear(exp)
						st.Mask(got)
						want.Mask(exp)
						var allowed []int32
						for id := range int32(len(got)) {
							g, w := math.IsInf(float64(got[id]), -1), math.IsInf(float64(exp[id]), -1)
							if g != w {
								t.Errorf("choice %d step %d: token %d masked %v, Go mask %v", choice, step, id, g, w)
								return
							}
							if a := st.(engine.TokenChecker).Allows(id); a == g {
								t.Errorf("choice %d step %d: Allows(%d) %v, masked %v", choice, step, id, a, g)
								return
							}
							if !g {
								allowed = append(allowed, id)
							}
						}
						if st.Complete() != want.Complete() {
							t.Errorf("choice %d step %d: Complete %v, Go mask %v", choice, step, st.Complete(), want.Complete())
						}
						if len(allowed) == 0 {
							return
						}
						// Choices 0 and 1 walk the same tokens, sharing states.
						next := allowed[rng.IntN(len(allowed))]
						if err := st.Accept(next); err != nil {
							t.Errorf("choice %d step %d: Accept(%d): %v", choice, step, next, err)
							return
						}
						if err := want.Accept(next); err != nil {
							t.Errorf("choice %d step %d: Go mask Accept(%d): %v", choice, step, next, err)
							return
						}
					}
				})
			}
			wg.Wait()
		})
	}
}

// Choices that walk the same tokens share the states of their compiled
// grammar: each transition is computed once on the Offload, not once per
// choice; and a state replayed over generated tokens needs none.
func TestOffloadedShared(t *testing.T) {
	e := tinyEngine(t)
	tok := e.Tokenizer()
	c, err := grammar.ForEngine(e).Compile(grammar.JSONObject)
	if err != nil {
		t.Fatal(err)
	}
	o := grammar.NewOffload(1, nil)
	const n = 8
	var sts []engine.GrammarState
	for range n {
		st, err := c.Offloaded(o, 1, tok.Encode(`{"a`))
		if err != nil {
			t.Fatal(err)
		}
		sts = append(sts, st)
	}
	if got := o.Done(); got != 0 {
		t.Errorf("%d jobs on the Offload for states replayed in the call, want 0", got)
	}
	text := tok.Encode(`bc": [1, 2`)
	for _, id := range text {
		for _, st := range sts {
			if err := st.Accept(id); err != nil {
				t.Fatal(err)
			}
		}
		for _, st := range sts {
			st.Complete() // waits for the state
		}
	}
	if got := o.Done(); got != int64(len(text)) {
		t.Errorf("%d choices over %d tokens: %d jobs, want one a token", n, len(text), got)
	}
	if _, err := c.Offloaded(o, 1, tok.Encode(`}`)); !errors.Is(err, grammar.ErrRejected) {
		t.Errorf("a refused generated token: %v, want ErrRejected", err)
	}
	if err := sts[0].Accept(tok.Encode("}")...); !errors.Is(err, grammar.ErrRejected) {
		t.Errorf("Accept of a token the mask refuses: %v, want ErrRejected", err)
	}

	// While the Offload is busy, a state that accepted a new token is
	// not Ready, and its mask waits for it.
	block, started := make(chan struct{}), make(chan struct{})
	o.Go(2, func() { close(started); <-block })
	<-started
	r := sts[0].(interface{ Ready() bool })
	if err := sts[0].Accept(tok.Encode("]")...); err != nil {
		t.Fatal(err)
	}
	if r.Ready() {
		t.Error("Ready with its state not computed")
	}
	close(block)
	if sts[0].Complete() || !r.Ready() {
		t.Errorf("after the Offload ran: Complete %v, Ready %v; want false, true", sts[0].Complete(), r.Ready())
	}
}

// The Offload takes keys in turn: a key with a long queue does not hold
// the workers while another key's work waits behind it.
func TestOffloadFairness(t *testing.T) {
	o := grammar.NewOffload(1, nil)
	block := make(chan struct{})
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	run := func(name string) func() {
		wg.Add(1)
		return func() {
			defer wg.Done()
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
		}
	}
	wg.Add(1)
	started := make(chan struct{})
	o.Go(1, func() { defer wg.Done(); close(started); <-block })
	<-started // the one worker is busy: what follows queues
	for i := range 4 {
		o.Go(1, run(fmt.Sprint("a", i)))
	}
	o.Go(2, run("b0"))
	o.Go(2, run("b1"))
	close(block)
	wg.Wait()
	want := []string{"a0", "b0", "a1", "b1", "a2", "a3"}
	if !slices.Equal(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}
	if o.Done() != 7 {
		t.Errorf("Done %d, want 7", o.Done())
	}
}

// A grammar whose start state is over MaxStateBytes is refused by
// Compile with a *LimitError naming the limit.
func TestCompileStateBytes(t *testing.T) {
	const depth, alts = 100, 4000
	var b strings.Builder
	b.WriteString("root ::= r0\n")
	for i := range depth {
		fmt.Fprintf(&b, "r%d ::= r%d \"x\"\n", i, i+1)
	}
	fmt.Fprintf(&b, "r%d ::= ", depth)
	for i := range alts {
		if i > 0 {
			b.WriteString(" | ")
		}
		fmt.Fprintf(&b, "[\\u%04x]", 0x100+i)
	}
	e := tinyEngine(t)
	_, err := grammar.ForEngine(e).Compile(b.String())
	var le *grammar.LimitError
	if !errors.As(err, &le) || le.Limit != "state bytes" || le.Max != grammar.MaxStateBytes {
		t.Fatalf("Compile: %v, want the state bytes limit", err)
	}
}
