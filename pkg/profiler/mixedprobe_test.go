package profiler

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/llamacpp"
)

// BenchmarkMixedStepProbe is a measurement, not a check (one run whatever -benchtime): what a llama.cpp mixed
// step (one prompt chunk of L tokens and B decode tokens at context N in
// one llama_decode) costs beyond its parts. For each (B, N) it times, in
// turn and repeated, the B-token decode step, the L-token prefill with the
// decode sequences live in the cache, and the mixed step, and prints
// their medians in ms; B = 0 rows are prefills in an empty cache. It runs
// only when PDSERVE_MIXED_PROBE names a GGUF file
// (PDSERVE_MIXED_PROBE_THREADS: threads, default 2), e.g.
//
//	go run ./cmd/mkgguf --shape qwen2.5-0.5b --tied --type q8_0 --seed 1 --out /tmp/q05.gguf
//	PDSERVE_MIXED_PROBE=/tmp/q05.gguf taskset -c 0,1 go test -run '^$' -bench MixedStepProbe -benchtime 1x -v -timeout 30m ./pkg/profiler/
func BenchmarkMixedStepProbe(bm *testing.B) {
	model := os.Getenv("PDSERVE_MIXED_PROBE")
	if model == "" {
		bm.Skip("PDSERVE_MIXED_PROBE (a GGUF file) is not set")
	}
	threads := 2
	if s := os.Getenv("PDSERVE_MIXED_PROBE_THREADS"); s != "" {
		threads, _ = strconv.Atoi(s)
	}
	lib, _ := repotest.Llama(bm)
	e, err := llamacpp.New(llamacpp.Options{LibDir: lib, Model: model, CtxSize: 4096, MaxSeqs: 17, Threads: threads})
	if err != nil {
		bm.Fatal(err)
	}
	defer e.Close()
	ctx := bm.Context()
	rng := rand.New(rand.NewPCG(1, 2))
	vocab := e.Spec().Vocab
	prompt := func(n int) []int32 {
		p := make([]int32, n)
		for i := range p {
			p[i] = 4 + int32(rng.IntN(vocab-4))
		}
		return p
	}
	next := engine.SeqID(1 << 40)
	id := func() engine.SeqID { next++; return next }
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	med := func(x []float64) float64 { s := slices.Clone(x); slices.Sort(s); return s[len(s)/2] }

	const reps = 3
	ls := []int{64, 126, 128, 256, 512}
	groups := [][2]int{{0, 0},
		{1, 32}, {2, 32}, {4, 32}, {8, 32}, {16, 32},
		{1, 256}, {2, 256}, {4, 256}, {8, 256}, {12, 256},
		{1, 1024}, {2, 1024}, {3, 1024}}
	fmt.Printf("PROBE B N L ctx dec_ms pre_ms mix_ms extra_ms(mix-pre-dec)\n")
	for _, g := range groups {
		b, n := g[0], g[1]
		live := make([]engine.SeqID, b)
		toks := map[engine.SeqID]int32{}
		for i := range live {
			live[i] = id()
			out, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: live[i], Tokens: prompt(n - 1), Last: true}}, nil)
			if err != nil {
				bm.Fatal(err)
			}
			toks[live[i]] = out[0].Token
		}
		dstep := func(pre []engine.PrefillItem) time.Duration {
			items := make([]engine.DecodeItem, b)
			for i, s := range live {
				items[i] = engine.DecodeItem{Seq: s, Token: toks[s]}
			}
			t0 := time.Now()
			_, out, err := engine.RunStep(ctx, e, pre, items, nil)
			d := time.Since(t0)
			if err != nil {
				bm.Fatal(err)
			}
			for i, o := range out {
				toks[items[i].Seq] = o.Token
			}
			return d
		}
		if b > 0 {
			dstep(nil) // warm-up
		}
		dec, pre, mix := map[int][]float64{}, map[int][]float64{}, map[int][]float64{}
		ctxs := map[int]int{}
		for range reps {
			for _, l := range ls {
				if b > 0 {
					dec[l] = append(dec[l], ms(dstep(nil)))
				}
				s := id()
				t0 := time.Now()
				if _, err := e.Prefill(ctx, []engine.PrefillItem{{Seq: s, Tokens: prompt(l), Last: true}}, nil); err != nil {
					bm.Fatal(err)
				}
				pre[l] = append(pre[l], ms(time.Since(t0)))
				e.Free(s)
				if b > 0 {
					s = id()
					mix[l] = append(mix[l], ms(dstep([]engine.PrefillItem{{Seq: s, Tokens: prompt(l), Last: true}})))
					e.Free(s)
					c, _ := e.Len(live[0])
					ctxs[l] = c
				}
			}
		}
		for _, l := range ls {
			if b == 0 {
				fmt.Printf("PROBE %d %d %d %d %.2f %.2f %.2f %.2f\n", b, n, l, 0, 0.0, med(pre[l]), 0.0, 0.0)
				continue
			}
			d, p, m := med(dec[l]), med(pre[l]), med(mix[l])
			fmt.Printf("PROBE %d %d %d %d %.2f %.2f %.2f %.2f\n", b, n, l, ctxs[l], d, p, m, m-p-d)
		}
		for _, s := range live {
			e.Free(s)
		}
	}
}
