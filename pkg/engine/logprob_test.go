package engine

import (
	"math"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// directLogprobs is log(exp(l_i) / Σ_j exp(l_j)) in float64, computed the
// textbook way (for logits small enough not to overflow).
func directLogprobs(logits []float32) []float64 {
	sum := 0.0
	for _, l := range logits {
		sum += math.Exp(float64(l))
	}
	out := make([]float64, len(logits))
	for i, l := range logits {
		out[i] = math.Log(math.Exp(float64(l)) / sum)
	}
	return out
}

func TestLogprobMatchesDirectSoftmax(t *testing.T) {
	const vocab = 1000
	logits := make([]float32, vocab)
	for i := range logits {
		logits[i] = float32(math.Sin(float64(i)*12.9898)*8 + math.Cos(float64(i)*0.37)*3)
	}
	want := directLogprobs(logits)
	order := make([]int32, vocab)
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int {
		switch {
		case logits[a] > logits[b]:
			return -1
		case logits[a] < logits[b]:
			return 1
		}
		return 0
	})
	const tol = 1e-5
	before := slices.Clone(logits)
	for _, tok := range []int32{0, 1, 17, order[0], order[vocab-1], vocab - 1} {
		for _, top := range []int{0, 1, 5, MaxTopLogprobs} {
			got := Logprob(logits, tok, top)
			if got.Token != tok {
				t.Errorf("Logprob(token %d).Token = %d", tok, got.Token)
			}
			if d := math.Abs(float64(got.Logprob) - want[tok]); d > tol {
				t.Errorf("Logprob(token %d) = %v, direct softmax %v (|Δ| %g > %g)", tok, got.Logprob, want[tok], d, tol)
			}
			if len(got.Top) != top {
				t.Fatalf("top %d: %d alternatives", top, len(got.Top))
			}
			for i, tp := range got.Top {
				if tp.Token != order[i] {
					t.Errorf("top %d: alternative %d is token %d, want %d", top, i, tp.Token, order[i])
				}
				if d := math.Abs(float64(tp.Logprob) - want[tp.Token]); d > tol {
					t.Errorf("top %d: alternative %d (token %d) logprob %v, direct %v", top, i, tp.Token, tp.Logprob, want[tp.Token])
				}
			}
		}
	}
	if diff := cmp.Diff(before, logits); diff != "" {
		t.Errorf("Logprob modified the logits (-before +after):\n%s", diff)
	}

	// Shift invariance with large logits, where the direct formula
	// would overflow: the same answers.
	shifted := make([]float32, vocab)
	for i, l := range logits {
		shifted[i] = l + 1e4
	}
	a, b := Logprob(logits, 17, 5), Logprob(shifted, 17, 5)
	if d := math.Abs(float64(a.Logprob - b.Logprob)); d > 1e-3 || !slices.EqualFunc(a.Top, b.Top, func(x, y TokenProb) bool { return x.Token == y.Token }) {
		t.Errorf("logits shifted by 1e4: %+v, unshifted %+v", b, a)
	}
}

func TestLogprobSumsToOne(t *testing.T) {
	logits := []float32{0.3, -2, 5, 1, 1, -7, 0}
	lp := Logprob(logits, 0, MaxTopLogprobs)
	if len(lp.Top) != len(logits) {
		t.Fatalf("top %d over a vocabulary of %d: %d alternatives, want %d (clamped to the vocabulary)", MaxTopLogprobs, len(logits), len(lp.Top), len(logits))
	}
	sum := 0.0
	for _, tp := range lp.Top {
		sum += math.Exp(float64(tp.Logprob))
	}
	if math.Abs(sum-1) > 1e-6 {
		t.Errorf("Σ exp(logprob) over the vocabulary = %v, want 1", sum)
	}
}

func TestLogprobEdgeCases(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	ninf := float32(math.Inf(-1))
	ln2 := float32(-math.Ln2)
	many := make([]float32, 50)
	for i := range many {
		many[i] = float32(i % 7)
	}
	tests := []struct {
		name    string
		logits  []float32
		token   int32
		top     int
		want    float32
		wantTop []int32 // token ids of Top, in order
	}{
		{"ties by lower id", []float32{1, 3, 3, 0, 3}, 0, 4, float32(1 - math.Log(math.Exp(1)+3*math.Exp(3)+1)), []int32{1, 2, 4, 0}},
		{"NaN counts as -Inf", []float32{nan, 0, nan, 0}, 1, 4, ln2, []int32{1, 3, 0, 2}},
		{"NaN token", []float32{nan, 0, nan, 0}, 2, 0, ninf, nil},
		{"-Inf logit", []float32{ninf, 0}, 0, 2, ninf, []int32{1, 0}},
		{"-Inf logit, other token", []float32{ninf, 0}, 1, 1, 0, []int32{1}},
		{"+Inf logits share the mass", []float32{inf, 1, inf}, 2, 3, ln2, []int32{0, 2, 1}},
		{"finite token next to +Inf", []float32{inf, 1, inf}, 1, 0, ninf, nil},
		{"all -Inf", []float32{ninf, ninf}, 0, 2, ninf, nil},
		{"all NaN", []float32{nan, nan}, 1, 2, ninf, nil},
		{"empty", nil, 0, 3, ninf, nil},
		{"token past the vocabulary", []float32{0, 0}, 2, 1, ninf, []int32{0}},
		{"negative token", []float32{0, 0}, -1, 1, ninf, []int32{0}},
		{"negative top", []float32{0, 0}, 0, -3, ln2, nil},
		{"top clamped to MaxTopLogprobs", many, 6, 100, float32(6 - math.Log(logSumExp7(50))), []int32{6, 13, 20, 27, 34, 41, 48, 5, 12, 19, 26, 33, 40, 47, 4, 11, 18, 25, 32, 39}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Logprob(tc.logits, tc.token, tc.top)
			if got.Token != tc.token {
				t.Errorf("Token = %d, want %d", got.Token, tc.token)
			}
			if !near(got.Logprob, tc.want) {
				t.Errorf("Logprob = %v, want %v", got.Logprob, tc.want)
			}
			var ids []int32
			for _, tp := range got.Top {
				ids = append(ids, tp.Token)
				if want := Logprob(tc.logits, tp.Token, 0).Logprob; !near(tp.Logprob, want) {
					t.Errorf("alternative %d: logprob %v, but Logprob of that token is %v", tp.Token, tp.Logprob, want)
				}
			}
			if diff := cmp.Diff(tc.wantTop, ids); diff != "" {
				t.Errorf("Top ids (-want +got):\n%s", diff)
			}
		})
	}
}

// logSumExp7 is Σ exp(i mod 7) over i < n.
func logSumExp7(n int) float64 {
	s := 0.0
	for i := range n {
		s += math.Exp(float64(i % 7))
	}
	return s
}

// near reports whether a and b are equal infinities or within 1e-6.
func near(a, b float32) bool {
	if math.IsInf(float64(a), 0) || math.IsInf(float64(b), 0) {
		return a == b
	}
	return math.Abs(float64(a-b)) <= 1e-6
}

func TestStandInLogprob(t *testing.T) {
	for _, tc := range []struct {
		token           int32
		pos, top, vocab int
		wantTop         int
	}{
		{65, 3, 5, 256, 5},
		{0, 0, 1, 256, 1},
		{7, 9, 0, 256, 0},
		{7, 9, -2, 256, 0},
		{7, 9, 100, 256, MaxTopLogprobs},
		{1, 4, 20, 3, 3},
		{0, 4, 5, 1, 1},
		{3, 4, 5, 0, 0},
	} {
		got := StandInLogprob(tc.token, tc.pos, tc.top, tc.vocab)
		if got.Token != tc.token || !near(got.Logprob, float32(-math.Ln2)) {
			t.Errorf("StandInLogprob(%d, %d, %d, %d) = token %d logprob %v, want token %d logprob -ln 2", tc.token, tc.pos, tc.top, tc.vocab, got.Token, got.Logprob, tc.token)
		}
		if len(got.Top) != tc.wantTop {
			t.Fatalf("StandInLogprob(%d, %d, top %d, vocab %d): %d alternatives, want %d", tc.token, tc.pos, tc.top, tc.vocab, len(got.Top), tc.wantTop)
		}
		seen := map[int32]bool{}
		for i, tp := range got.Top {
			if i == 0 && tp.Token != tc.token {
				t.Errorf("first alternative %d, want the token %d", tp.Token, tc.token)
			}
			if i > 0 && (tp.Token < 0 || int(tp.Token) >= tc.vocab) {
				t.Errorf("alternative %d: token %d outside [0, %d)", i, tp.Token, tc.vocab)
			}
			if seen[tp.Token] {
				t.Errorf("alternative %d: token %d listed twice", i, tp.Token)
			}
			seen[tp.Token] = true
			if want := float32(-math.Ln2 * float64(i+1)); !near(tp.Logprob, want) {
				t.Errorf("alternative %d: logprob %v, want %v (halving down the list)", i, tp.Logprob, want)
			}
		}
		if again := StandInLogprob(tc.token, tc.pos, tc.top, tc.vocab); !cmp.Equal(got, again) {
			t.Errorf("StandInLogprob is not a pure function: %+v then %+v", got, again)
		}
	}
	differ := false
	for pos := 1; pos < 10 && !differ; pos++ {
		differ = !cmp.Equal(StandInLogprob(65, 0, 5, 256), StandInLogprob(65, pos, 5, 256))
	}
	if !differ {
		t.Error("alternatives do not depend on the position")
	}
}
