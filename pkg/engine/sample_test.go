package engine

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSampleGreedy(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	tests := []struct {
		name   string
		logits []float32
		s      Sampling
		want   int32
	}{
		{"argmax", []float32{0.1, 2, -1, 1.9}, Sampling{}, 1},
		{"lowest id on ties", []float32{1, 3, 0, 3, 3}, Sampling{}, 1},
		{"single", []float32{-5}, Sampling{}, 0},
		{"NaN skipped", []float32{nan, -1, nan, -0.5}, Sampling{}, 3},
		{"all NaN", []float32{nan, nan}, Sampling{}, 0},
		{"+Inf wins", []float32{1, inf, 2}, Sampling{}, 1},
		{"negative temperature is greedy", []float32{0, 1, 0}, Sampling{Temperature: -1, Seed: 3}, 1},
		{"NaN temperature is greedy", []float32{0, 1, 0}, Sampling{Temperature: nan, Seed: 3}, 1},
		{"empty", nil, Sampling{}, -1},
		{"+Inf with temperature", []float32{1, inf, 2}, Sampling{Temperature: 1, Seed: 9}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var sc SampleScratch
			for pos := range 5 {
				if got := Sample(tc.logits, tc.s, pos, &sc); got != tc.want {
					t.Fatalf("Sample(%v, %+v, pos %d) = %d, want %d", tc.logits, tc.s, pos, got, tc.want)
				}
			}
		})
	}
}

// logitsOf returns logits whose softmax at temperature 1 is p.
func logitsOf(p ...float64) []float32 {
	l := make([]float32, len(p))
	for i, v := range p {
		l[i] = float32(math.Log(v))
	}
	return l
}

// frequencies samples positions [0, n) and returns each token's share.
func frequencies(t *testing.T, logits []float32, s Sampling, n int) []float64 {
	t.Helper()
	var sc SampleScratch
	f := make([]float64, len(logits))
	for pos := range n {
		id := Sample(logits, s, pos, &sc)
		if id < 0 || int(id) >= len(logits) {
			t.Fatalf("Sample at pos %d = %d, outside [0, %d)", pos, id, len(logits))
		}
		f[id]++
	}
	for i := range f {
		f[i] /= float64(n)
	}
	return f
}

func TestSampleDistribution(t *testing.T) {
	const n = 40000
	approx := cmpApprox(0.015)
	tests := []struct {
		name   string
		logits []float32
		s      Sampling
		want   []float64
	}{
		{"temperature 1", logitsOf(0.5, 0.3, 0.2), Sampling{Temperature: 1, Seed: 1}, []float64{0.5, 0.3, 0.2}},
		{"top-p 1 keeps all", logitsOf(0.5, 0.3, 0.2), Sampling{Temperature: 1, TopP: 1, Seed: 2}, []float64{0.5, 0.3, 0.2}},
		{"top-p 0.6 keeps two", logitsOf(0.2, 0.5, 0.3), Sampling{Temperature: 1, TopP: 0.6, Seed: 3}, []float64{0, 0.625, 0.375}},
		{"top-p 0.5 keeps one", logitsOf(0.2, 0.5, 0.3), Sampling{Temperature: 1, TopP: 0.5, Seed: 4}, []float64{0, 1, 0}},
		{"top-p ties by id", logitsOf(0.25, 0.25, 0.25, 0.25), Sampling{Temperature: 1, TopP: 0.5, Seed: 5}, []float64{0.5, 0.5, 0, 0}},
		// Temperature 2 flattens p ∝ sqrt(p): sqrt(0.64)=0.8, sqrt(0.36)=0.6.
		{"temperature 2", logitsOf(0.64, 0.36), Sampling{Temperature: 2, Seed: 6}, []float64{0.8 / 1.4, 0.6 / 1.4}},
		{"tiny temperature is near greedy", logitsOf(0.4, 0.6), Sampling{Temperature: 1e-3, Seed: 7}, []float64{0, 1}},
		{"-Inf logit never drawn", []float32{float32(math.Inf(-1)), 0, 0}, Sampling{Temperature: 1, Seed: 8}, []float64{0, 0.5, 0.5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := frequencies(t, tc.logits, tc.s, n)
			if diff := cmp.Diff(tc.want, got, approx); diff != "" {
				t.Errorf("token frequencies over %d positions (-want +got):\n%s", n, diff)
			}
		})
	}
}

func cmpApprox(tol float64) cmp.Option {
	return cmp.Comparer(func(a, b float64) bool { return math.Abs(a-b) <= tol })
}

func TestSampleDependsOnlyOnSeedAndPos(t *testing.T) {
	logits := make([]float32, 300)
	for i := range logits {
		logits[i] = float32(math.Sin(float64(i))) * 2
	}
	s := Sampling{Temperature: 0.9, TopP: 0.95, Seed: 42}
	var a, b SampleScratch
	first := make([]int32, 64)
	for pos := range first {
		first[pos] = Sample(logits, s, pos, &a)
	}
	// Reversed order, a fresh scratch, a shared scratch used for another
	// request in between: the same tokens.
	for pos := len(first) - 1; pos >= 0; pos-- {
		Sample(logits, Sampling{Temperature: 1, Seed: 7}, pos+1000, &b)
		if got := Sample(logits, s, pos, &b); got != first[pos] {
			t.Fatalf("pos %d: token %d, earlier %d", pos, got, first[pos])
		}
		if got := Sample(logits, s, pos, nil); got != first[pos] {
			t.Fatalf("pos %d with nil scratch: token %d, earlier %d", pos, got, first[pos])
		}
	}
	distinct := map[int32]bool{}
	for _, id := range first {
		distinct[id] = true
	}
	if len(distinct) < 8 {
		t.Errorf("64 draws from a flat-ish distribution gave only %d distinct tokens", len(distinct))
	}
	other := 0
	for pos := range first {
		if Sample(logits, Sampling{Temperature: 0.9, TopP: 0.95, Seed: 43}, pos, &a) != first[pos] {
			other++
		}
	}
	if other < len(first)/2 {
		t.Errorf("seed 43 agrees with seed 42 on %d of %d positions", len(first)-other, len(first))
	}
}

func TestUniform(t *testing.T) {
	const n = 100000
	sum := 0.0
	for pos := range n {
		u := Uniform(12345, pos)
		if u < 0 || u >= 1 {
			t.Fatalf("Uniform(12345, %d) = %v, outside [0, 1)", pos, u)
		}
		sum += u
	}
	if mean := sum / n; math.Abs(mean-0.5) > 0.005 {
		t.Errorf("mean of %d draws = %v, want 0.5 ± 0.005", n, mean)
	}
	if Uniform(1, 5) != Uniform(1, 5) || Uniform(1, 5) == Uniform(2, 5) || Uniform(1, 5) == Uniform(1, 6) {
		t.Errorf("Uniform is not a pure function of distinct (seed, pos)")
	}
	// Fixed values: other engines and releases must draw the same numbers.
	if got, want := Uniform(0, 0), float64(splitmix64(splitmix64(0))>>11)*0x1p-53; got != want {
		t.Errorf("Uniform(0, 0) = %v, want %v", got, want)
	}
	if got := splitmix64(0); got != 0xe220a8397b1dcdaf {
		t.Errorf("splitmix64(0) = %#x, want 0xe220a8397b1dcdaf (reference SplitMix64 first output for seed 0)", got)
	}
}

func TestSampleDoesNotAllocate(t *testing.T) {
	logits := make([]float32, 1000)
	for i := range logits {
		logits[i] = float32(i%17) * 0.3
	}
	var sc SampleScratch
	Sample(logits, Sampling{Temperature: 1, TopP: 0.9}, 0, &sc) // grow scratch
	for _, s := range []Sampling{{}, {Temperature: 0.7}, {Temperature: 0.7, TopP: 0.9, Seed: 1}} {
		pos := 0
		allocs := testing.AllocsPerRun(50, func() {
			Sample(logits, s, pos, &sc)
			pos++
		})
		if allocs != 0 {
			t.Errorf("Sample with %+v: %v allocations per call, want 0", s, allocs)
		}
	}
}

func TestSamplePenalties(t *testing.T) {
	logits := []float32{1, 3, 2.5, -1, 2.9}
	tests := []struct {
		name string
		p    *Penalties
		want int32
	}{
		{"nil", nil, 1},
		{"presence flips argmax", &Penalties{Presence: 0.6, Counts: map[int32]int32{1: 1}}, 4},
		{"presence too small", &Penalties{Presence: 0.05, Counts: map[int32]int32{1: 1}}, 1},
		{"frequency grows with count", &Penalties{Frequency: 0.3, Counts: map[int32]int32{1: 2, 4: 1}}, 4},
		{"frequency beats a lower logit", &Penalties{Frequency: 0.3, Counts: map[int32]int32{1: 2, 4: 2}}, 2},
		{"both", &Penalties{Presence: 0.3, Frequency: 0.3, Counts: map[int32]int32{1: 1, 4: 1}}, 2},
		{"negative penalty favours a seen token", &Penalties{Presence: -2, Counts: map[int32]int32{2: 1}}, 2},
		{"zero and negative counts ignored", &Penalties{Presence: 2, Frequency: 2, Counts: map[int32]int32{1: 0, 4: -3}}, 1},
		{"ids outside the vocabulary ignored", &Penalties{Presence: 2, Counts: map[int32]int32{-1: 1, 5: 1, 1 << 20: 1}}, 1},
		{"inactive: zero penalties", &Penalties{Counts: map[int32]int32{1: 4}}, 1},
		{"inactive: no counts", &Penalties{Presence: 2, Frequency: 2}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := append([]float32(nil), logits...)
			var sc SampleScratch
			if got := Sample(logits, Sampling{Penalties: tc.p}, 0, &sc); got != tc.want {
				t.Errorf("greedy Sample with %+v = %d, want %d", tc.p, got, tc.want)
			}
			if got := Sample(logits, Sampling{Penalties: tc.p}, 0, nil); got != tc.want {
				t.Errorf("greedy Sample with %+v and nil scratch = %d, want %d", tc.p, got, tc.want)
			}
			if diff := cmp.Diff(before, logits); diff != "" {
				t.Errorf("Sample modified the logits (-before +after):\n%s", diff)
			}
		})
	}
}

// TestSamplePenaltiesAreLogitShifts: sampling with penalties draws what
// sampling without them draws from logits shifted by hand.
func TestSamplePenaltiesAreLogitShifts(t *testing.T) {
	logits := make([]float32, 200)
	for i := range logits {
		logits[i] = float32(math.Sin(float64(i)*0.7)) * 3
	}
	p := &Penalties{Presence: 0.5, Frequency: 0.25, Counts: map[int32]int32{}}
	for i := int32(0); i < 200; i += 3 {
		p.Counts[i] = i%5 + 1
	}
	shifted := append([]float32(nil), logits...)
	for id, c := range p.Counts {
		shifted[id] -= p.Frequency*float32(c) + p.Presence
	}
	var a, b SampleScratch
	differ := 0
	for _, base := range []Sampling{{}, {Temperature: 0.8, Seed: 1}, {Temperature: 1.2, TopP: 0.7, Seed: 2}} {
		withPen := base
		withPen.Penalties = p
		for pos := range 200 {
			got, want := Sample(logits, withPen, pos, &a), Sample(shifted, base, pos, &b)
			if got != want {
				t.Fatalf("%+v at pos %d: token %d, shifted logits give %d", base, pos, got, want)
			}
			if got != Sample(logits, base, pos, &b) {
				differ++
			}
		}
	}
	if differ == 0 {
		t.Error("penalties never changed a token")
	}
}

// TestSampleInactivePenaltiesBitIdentical: a Penalties that changes no
// logit gives the tokens of none, under every sampling mode.
func TestSampleInactivePenaltiesBitIdentical(t *testing.T) {
	logits := make([]float32, 300)
	for i := range logits {
		logits[i] = float32(math.Cos(float64(i)*1.3)) * 2
	}
	inactive := []*Penalties{nil, {}, {Counts: map[int32]int32{5: 3}}, {Presence: 1, Frequency: 1}}
	var a, b SampleScratch
	for _, base := range []Sampling{{}, {Temperature: 0.7, Seed: 3}, {Temperature: 1, TopP: 0.9, Seed: 4}} {
		for _, p := range inactive {
			s := base
			s.Penalties = p
			for pos := range 100 {
				if got, want := Sample(logits, s, pos, &a), Sample(logits, base, pos, &b); got != want {
					t.Fatalf("%+v with inactive penalties %+v at pos %d: token %d, want %d", base, p, pos, got, want)
				}
			}
		}
	}
}

func TestSamplePenaltiesDoNotAllocate(t *testing.T) {
	logits := make([]float32, 1000)
	for i := range logits {
		logits[i] = float32(i%17) * 0.3
	}
	p := &Penalties{Presence: 0.5, Frequency: 0.1, Counts: map[int32]int32{16: 2, 33: 1, 999: 7}}
	var sc SampleScratch
	Sample(logits, Sampling{Temperature: 1, TopP: 0.9, Penalties: p}, 0, &sc) // grow scratch
	for _, s := range []Sampling{{Penalties: p}, {Temperature: 0.7, Penalties: p}, {Temperature: 0.7, TopP: 0.9, Seed: 1, Penalties: p}} {
		pos := 0
		allocs := testing.AllocsPerRun(50, func() {
			Sample(logits, s, pos, &sc)
			pos++
		})
		if allocs != 0 {
			t.Errorf("Sample with %+v: %v allocations per call, want 0", s, allocs)
		}
	}
}

// sampleFullSort is top-p sampling as Sample specifies it, by a sort of the
// whole vocabulary: the reference for drawTopP's partial selection.
func sampleFullSort(logits []float32, s Sampling, pos int) int32 {
	best := argmax(logits)
	maxLogit, invT := float64(logits[best]), 1/float64(s.Temperature)
	prob := make([]float64, len(logits))
	total := 0.0
	for i, l := range logits {
		prob[i] = math.Exp((float64(l) - maxLogit) * invT)
		total += prob[i]
	}
	idx := make([]int32, len(logits))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortFunc(idx, func(a, b int32) int { return orderProb(prob, a, b) })
	want := float64(s.TopP) * total
	kept, mass := 0, 0.0
	for kept < len(idx) {
		mass += prob[idx[kept]]
		kept++
		if mass >= want {
			break
		}
	}
	return drawInOrder(prob, idx[:kept], Uniform(s.Seed, pos)*mass, best)
}

// TestSampleTopPMatchesFullSort: the heap selection draws the token a sort
// of the whole vocabulary draws, on peaked, flat and tied distributions
// whose nucleus takes a few ids, hundreds (past the first heap of 64) or
// most of the vocabulary (the full sort).
func TestSampleTopPMatchesFullSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	shapes := map[string]func(i int) float32{
		"peaked":   func(int) float32 { return float32(rng.NormFloat64() * 4) },
		"flat":     func(int) float32 { return float32(rng.NormFloat64() * 0.05) },
		"tied":     func(int) float32 { return float32(rng.IntN(4)) * 0.5 },
		"all-same": func(int) float32 { return 1 },
	}
	var sc SampleScratch
	draws := 0
	for name, shape := range shapes {
		for _, n := range []int{3, 100, 5000} {
			logits := make([]float32, n)
			for i := range logits {
				logits[i] = shape(i)
			}
			for _, topP := range []float32{0.01, 0.3, 0.9, 0.99} {
				for pos := range 20 {
					s := Sampling{Temperature: 0.8, TopP: topP, Seed: uint64(n)}
					if got, want := Sample(logits, s, pos, &sc), sampleFullSort(logits, s, pos); got != want {
						t.Fatalf("%s, %d ids, top-p %v, position %d: drew %d, a full sort draws %d", name, n, topP, pos, got, want)
					}
					draws++
				}
			}
		}
	}
	t.Logf("%d draws agree", draws)
}

// BenchmarkSampleTopP: one top-p draw over Qwen2's vocabulary size, from
// peaked logits (the nucleus is in the first 64 ids: the heap alone), from
// wider and flat ones (it takes thousands of ids or most of the vocabulary,
// as with random weights: the radix sort); "flat/sort" is the flat draw by
// a comparison sort of the vocabulary, for scale. The softmax's exp over
// the vocabulary is most of the peaked case.
func BenchmarkSampleTopP(b *testing.B) {
	for _, c := range []struct {
		name  string
		scale float64
		sort  bool
	}{{"peaked", 8, false}, {"normal", 3, false}, {"flat", 0.3, false}, {"flat/sort", 0.3, true}} {
		b.Run(c.name, func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			logits := make([]float32, 151936)
			for i := range logits {
				logits[i] = float32(rng.NormFloat64() * c.scale)
			}
			var sc SampleScratch
			s := Sampling{Temperature: 1, TopP: 0.95, Seed: 1}
			for i := 0; b.Loop(); i++ {
				if c.sort {
					sampleFullSort(logits, s, i)
				} else {
					Sample(logits, s, i, &sc)
				}
			}
		})
	}
}

// TestTopProbIsSortPrefix: the heap keeps exactly the first k ids of the
// full order, ties in probability broken by the lower id.
func TestTopProbIsSortPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, levels := range []int{1, 3, 1000} {
		prob := make([]float64, 2000)
		for i := range prob {
			prob[i] = float64(rng.IntN(levels))
		}
		all := make([]int32, len(prob))
		for i := range all {
			all[i] = int32(i)
		}
		slices.SortFunc(all, func(a, b int32) int { return orderProb(prob, a, b) })
		for _, k := range []int{1, 7, 64, 500} {
			if diff := cmp.Diff(all[:k], topProb(prob, k, make([]int32, 0, k))); diff != "" {
				t.Errorf("%d levels, k %d: heap selection differs from the sort's first k (-want +got):\n%s", levels, k, diff)
			}
		}
	}
}

// setConstraint allows the ids in ok; checker adds engine.TokenChecker.
type setConstraint struct{ ok map[int32]bool }

func (c setConstraint) Mask(l []float32) {
	for i := range l {
		if !c.ok[int32(i)] {
			l[i] = float32(math.Inf(-1))
		}
	}
}

type checker struct{ setConstraint }

func (c checker) Allows(t int32) bool { return c.ok[t] }

// A TokenChecker constraint is asked about the unmasked choice first:
// greedy gives the token masking first gives, bit for bit; a draw with
// the temperature gives an allowed token; with TopP the mask comes first,
// so the token is the one masking first gives.
func TestSampleConstraintChecker(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 5))
	for trial := range 300 {
		logits := make([]float32, 50)
		for i := range logits {
			logits[i] = float32(rng.NormFloat64() * 3)
		}
		ok := map[int32]bool{}
		for i := range int32(50) {
			if rng.IntN(4) == 0 {
				ok[i] = true
			}
		}
		set, chk := setConstraint{ok}, checker{setConstraint{ok}}
		for _, s := range []Sampling{{}, {Temperature: 0.8, Seed: uint64(trial)}, {Temperature: 1, TopP: 0.7, Seed: uint64(trial)}} {
			s.Constraint = set
			want := Sample(logits, s, trial, nil)
			s.Constraint = chk
			got := Sample(logits, s, trial, nil)
			if len(ok) > 0 && !ok[got] {
				t.Fatalf("trial %d %+v: token %d not allowed", trial, s, got)
			}
			if (s.Temperature == 0 || s.TopP > 0) && got != want {
				t.Fatalf("trial %d %+v: checker gave %d, masking first %d", trial, s, got, want)
			}
		}
	}
}

// The redraw after a refused first choice keeps the masked distribution:
// over many seeds each allowed token comes up at its masked softmax
// probability (within 5 standard deviations).
func TestSampleConstraintRedrawDistribution(t *testing.T) {
	logits := []float32{2, 1.5, 0.3, -1, 0.9, 1.2}
	ok := map[int32]bool{1: true, 2: true, 4: true}
	c := checker{setConstraint{ok}}
	const n = 40000
	count := map[int32]int{}
	for seed := range uint64(n) {
		count[Sample(logits, Sampling{Temperature: 1, Seed: seed, Constraint: c}, 3, nil)]++
	}
	z := 0.0
	for id := range ok {
		z += math.Exp(float64(logits[id]))
	}
	for id, c := range count {
		if !ok[id] {
			t.Fatalf("token %d drawn %d times, not allowed", id, c)
		}
		p := math.Exp(float64(logits[id])) / z
		if sd := math.Sqrt(n * p * (1 - p)); math.Abs(float64(c)-n*p) > 5*sd {
			t.Errorf("token %d drawn %d times, want %.0f ± %.0f", id, c, n*p, 5*sd)
		}
	}
}
