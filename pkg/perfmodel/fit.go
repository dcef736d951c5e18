package perfmodel

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// ErrFit reports measured points from which no coefficients can be fitted
// (too few, or not spread enough); match with errors.Is.
var ErrFit = errors.New("perfmodel: cannot fit")

// FitMethod describes what FitDistServe does, for Measurement.Fit.Method.
const FitMethod = "distserve form; least squares on relative error (rows weighted 1/measured); " +
	"non-negative coefficients (a negative one is fixed at 0 and the rest refitted); " +
	"prefill, decode and mixed points fitted jointly, mixed steps paying max(a_p, a_d) once " +
	"plus a mixed-step interaction m0 + m1·Σn + m2·Σl·Σn fitted on the mixed points; " +
	"a cross-prompt term x·Σ lᵢ·(cells of the step's other prompts) fitted on multi-prompt points; " +
	"one decode regime, or two split at the smallest measured batch size where the decode-only fit improves with F > 10 and its error is within 25% of the best split's"

// minGroupPoints is the fewest distinct prefill-only and decode-only
// points a fit needs: three coefficients each. Each decode regime of a
// two-regime fit needs as many.
const minGroupPoints = 3

// Coefficient indices of the fit's design matrix.
const (
	colAP = iota // a_p
	colBP        // b_p
	colCP        // c_p
	colAS        // a_d, small batches
	colBS        // b_d, small batches
	colCS        // c_d, small batches
	colAL        // a_d, large batches (the only regime of a one-regime fit)
	colBL        // b_d, large batches
	colCL        // c_d, large batches
	colM0        // mixed m0
	colM1        // mixed m1
	colM2        // mixed m2
	colX         // cross-prompt x
	nCols
)

// FitDistServe fits the DistServe form (see DistServe and StepSeconds) to
// measured step_ms points: prefill-only points fix a_p, b_p, c_p and, when
// some have several prompts, the cross-prompt coefficient PrefillCross;
// decode-only points a_d, b_d, c_d; mixed points (prefill chunks and
// decode tokens in one step) enter the same fit with the fixed cost
// max(a_p, a_d), whichever is larger, and alone fix the interaction
// coefficients Mixed (m0, m1, m2), which are 0 without mixed points. The
// fit minimises Σ ((model − measured) / measured)², the squared relative
// errors, so that short and long steps count alike; a coefficient that
// comes out negative is fixed at 0 and the others refitted, so that no
// term predicts negative time.
//
// Decode has one regime (LargeBatchThreshold 1, DecodeSmall equal to
// DecodeLarge) unless two fit the decode-only points significantly
// better: every measured decode batch size with at least three distinct
// decode points on each side is tried as LargeBatchThreshold, a split is
// kept when its F statistic exceeds 10 (about p < 0.001 for a profile's
// decode points; fits within 1% rms count as exact), and of those the
// smallest threshold whose error is within 25% of the least wins.
// llama.cpp's CPU backend, for one, runs a batch of one token through
// other kernels than a batch of two.
//
// Points of other metrics are ignored. Errors: ErrFit when fewer than
// three distinct prefill-only or decode-only points are given.
func FitDistServe(points []Point) (*DistServe, error) {
	var pre, dec, mix []fitRow
	seenP, seenD := map[[3]float64]bool{}, map[[2]float64]bool{}
	for _, pt := range points {
		if pt.Metric != MetricStepMs {
			continue
		}
		r := rowOf(pt)
		switch {
		case r.nP > 0 && r.nD == 0:
			pre = append(pre, r)
			seenP[[3]float64{r.sumL, r.sumQ, r.cross}] = true
		case r.nD > 0 && r.nP == 0:
			dec = append(dec, r)
			seenD[[2]float64{r.sumN, r.nD}] = true
		case r.nP > 0 && r.nD > 0:
			mix = append(mix, r)
		}
	}
	if len(seenP) < minGroupPoints || len(seenD) < minGroupPoints {
		return nil, fmt.Errorf("%w: %d distinct prefill and %d distinct decode points (want ≥ %d of each)",
			ErrFit, len(seenP), len(seenD), minGroupPoints)
	}
	t := decodeThreshold(dec)
	co := fitThreshold(pre, dec, mix, t)
	d := &DistServe{LargeBatchThreshold: t, PrefillCross: co[colX]}
	copy(d.Prefill[:], co[colAP:colCP+1])
	copy(d.DecodeLarge[:], co[colAL:colCL+1])
	copy(d.Mixed[:], co[colM0:colM2+1])
	d.DecodeSmall = d.DecodeLarge
	if t > 1 {
		copy(d.DecodeSmall[:], co[colAS:colCS+1])
	}
	return d, nil
}

// fitNoiseFloor is the mean squared relative error below which a fit
// counts as exact: 1% rms, the repeatability of a measured step. Without
// it an exact model's rounding would pass for a second decode regime.
const fitNoiseFloor = 1e-4

// splitF is the F statistic a second decode regime must exceed: about
// p < 0.001 for the 3 extra coefficients and the 18–30 decode points of a
// profile, so that noise almost never splits one regime in two.
const splitF = 10

// decodeFit fits the decode-only points alone with regimes split at t
// (1: one regime) and returns the weighted squared error and how many
// coefficients are non-zero. The regimes are decode's: judged on decode
// points alone, no mixed point's freedom pays for a split.
func decodeFit(dec []fitRow, t int) (e float64, k int) {
	a := design(dec, t, [2]bool{})
	c := nnls(a, targets(dec))
	for _, v := range c {
		if v != 0 {
			k++
		}
	}
	return sse(a, c, targets(dec)), k
}

// splitSlack is how much more error than the best split a smaller
// threshold may have and still be preferred: between two measured batch
// sizes the switch's place is unknown, and a lower threshold stretches
// the small-batch regime's per-sequence slope over fewer unmeasured
// sizes (llama.cpp's CPU decode costs the same at B = 2, 3 and 4, but a
// split at 4 would price B = 3 on the slope from 1 to 2).
const splitSlack = 1.25

// decodeThreshold returns the LargeBatchThreshold of the fit: 1 (one
// regime) unless splitting at a measured batch size passes the F test
// ((SSE₁ − SSE₂)/Δk) / (SSE₂/(n − k₂)) > splitF, SSE₂ floored at
// fitNoiseFloor per degree of freedom. Of the splits that pass, the
// smallest whose error is within splitSlack of the least.
func decodeThreshold(dec []fitRow) int {
	n := float64(len(dec))
	one, k1 := decodeFit(dec, 1)
	type pass struct {
		t   int
		sse float64
	}
	var passed []pass
	least := math.Inf(1)
	for _, t := range splits(dec) {
		two, k2 := decodeFit(dec, t)
		dof := n - float64(k2)
		if k2 <= k1 || dof < 1 || two >= one {
			continue
		}
		if f := (one - two) / float64(k2-k1) / (max(two, dof*fitNoiseFloor) / dof); f > splitF {
			passed = append(passed, pass{t, two})
			least = min(least, two)
		}
	}
	for _, p := range passed { // ascending t
		if p.sse <= splitSlack*least {
			return p.t
		}
	}
	return 1
}

// splits returns the decode batch sizes that can split dec into two
// regimes with at least minGroupPoints distinct points each.
func splits(dec []fitRow) []int {
	var sizes []int
	seen := map[int]bool{}
	for _, r := range dec {
		if b := int(r.nD); !seen[b] {
			seen[b] = true
			sizes = append(sizes, b)
		}
	}
	var out []int
	for _, t := range sizes {
		below, above := map[[2]float64]bool{}, map[[2]float64]bool{}
		for _, r := range dec {
			if int(r.nD) < t {
				below[[2]float64{r.sumN, r.nD}] = true
			} else {
				above[[2]float64{r.sumN, r.nD}] = true
			}
		}
		if len(below) >= minGroupPoints && len(above) >= minGroupPoints {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out
}

// fitThreshold fits every coefficient with decode regimes split at
// threshold t (1: one regime, in the large-batch columns). Without mixed
// points prefill and decode are fitted apart. With them all points are
// fitted together for each choice of which fixed cost, a_p or a regime's
// a_d, a mixed step pays as the larger, and the consistent choice of
// least error is kept; when none is consistent, the choice of least error,
// which StepSeconds then prices with the larger fixed cost (a mixed step
// dearer by |a_p − a_d| than fitted).
func fitThreshold(pre, dec, mix []fitRow, t int) []float64 {
	fit := func(rows []fitRow, prefillFixed [2]bool) ([]float64, float64) {
		a := design(rows, t, prefillFixed)
		c := nnls(a, targets(rows))
		return c, sse(a, c, targets(rows))
	}
	if len(mix) == 0 {
		cp, _ := fit(pre, [2]bool{})
		cd, _ := fit(dec, [2]bool{})
		coef := make([]float64, nCols)
		copy(coef[colAP:colCP+1], cp[colAP:colCP+1])
		coef[colX] = cp[colX]
		copy(coef[colAS:colCL+1], cd[colAS:colCL+1])
		return coef
	}
	rows := append(append(append([]fitRow{}, pre...), dec...), mix...)
	aD := [2]int{colAS, colAL} // each regime's a_d column
	used := []int{1}           // the regimes in use: large only, or both
	choices := [][2]bool{{true, true}, {true, false}}
	if t > 1 {
		used = []int{0, 1}
		choices = append(choices, [2]bool{false, true}, [2]bool{false, false})
	}
	var best, any []float64
	bestSSE, anySSE := math.Inf(1), math.Inf(1)
	for _, pf := range choices {
		c, e := fit(rows, pf)
		if e < anySSE {
			any, anySSE = c, e
		}
		consistent := true
		for _, r := range used {
			if (c[colAP] >= c[aD[r]]) != pf[r] && c[colAP] != c[aD[r]] {
				consistent = false
			}
		}
		if consistent && e < bestSSE {
			best, bestSSE = c, e
		}
	}
	if best == nil {
		return any
	}
	return best
}

// fitRow is one point's sums in the DistServe form, and its value in ms.
type fitRow struct {
	nP, nD, sumL, sumQ, sumN, cross, ms float64
}

func rowOf(pt Point) fitRow {
	b := pt.Batch()
	r := fitRow{nP: float64(len(b.Prefill)), nD: float64(len(b.Decode)), ms: pt.Value}
	r.sumL, r.sumQ, r.cross = b.prefillSums()
	for _, n := range b.Decode {
		r.sumN += float64(max(n, 0))
	}
	return r
}

// design returns the weighted design matrix of rows over the coefficients
// (colAP … colX) with decode regimes split at threshold t (1: every row in
// the large-batch columns); a mixed row of regime r (0 small, 1 large)
// pays a_p when prefillFixed[r], else its regime's a_d, and only mixed
// rows have m0, m1, m2. Each row is divided by its measured value, so
// that least squares minimises relative errors.
func design(rows []fitRow, t int, prefillFixed [2]bool) [][]float64 {
	a := make([][]float64, 0, len(rows))
	for _, r := range rows {
		w := 1 / r.ms
		x := make([]float64, nCols)
		regime, base := 1, colAL
		if t > 1 && r.nD < float64(t) {
			regime, base = 0, colAS
		}
		if r.nP > 0 {
			x[colBP], x[colCP], x[colX] = r.sumL*w, r.sumQ*w, r.cross*w
		}
		if r.nD > 0 {
			x[base+1], x[base+2] = r.sumN*w, r.nD*w
		}
		if r.nP > 0 && r.nD > 0 {
			x[colM0], x[colM1], x[colM2] = w, r.sumN*w, r.sumL*r.sumN*w
		}
		switch {
		case r.nD == 0, r.nP > 0 && prefillFixed[regime]:
			x[colAP] = w
		default:
			x[base] = w
		}
		a = append(a, x)
	}
	return a
}

// targets are the weighted values: all 1 (measured / measured).
func targets(rows []fitRow) []float64 {
	y := make([]float64, len(rows))
	for i := range y {
		y[i] = 1
	}
	return y
}

func sse(a [][]float64, c, y []float64) float64 {
	var s float64
	for i, row := range a {
		var v float64
		for j, x := range row {
			v += x * c[j]
		}
		s += (v - y[i]) * (v - y[i])
	}
	return s
}

// nnls solves min ‖A·c − y‖ subject to c ≥ 0 by elimination: solve the
// unconstrained problem over the free columns, fix the most negative
// coefficient at 0, repeat. Columns that are all zero, or that the others
// already span, get 0.
func nnls(a [][]float64, y []float64) []float64 {
	n := len(a[0])
	free := make([]bool, n)
	for j := range free {
		for _, row := range a {
			if row[j] != 0 {
				free[j] = true
				break
			}
		}
	}
	for {
		c := lstsq(a, y, free)
		worst, at := 0.0, -1
		for j, v := range c {
			if free[j] && v < worst {
				worst, at = v, j
			}
		}
		if at < 0 {
			return c
		}
		free[at] = false
	}
}

// lstsq solves min ‖A·c − y‖ over the free columns (the others are 0) by
// modified Gram–Schmidt on unit-scaled columns; a column within 1e-9 of
// the span of the earlier ones is dropped (coefficient 0).
func lstsq(a [][]float64, y []float64, free []bool) []float64 {
	m, n := len(a), len(free)
	var cols []int
	var q [][]float64 // orthonormal columns, m each
	r := make([][]float64, n)
	scale := make([]float64, n)
	for j := range n {
		if !free[j] {
			continue
		}
		v := make([]float64, m)
		var norm float64
		for i := range m {
			v[i] = a[i][j]
			norm += v[i] * v[i]
		}
		norm = math.Sqrt(norm)
		if norm == 0 {
			continue
		}
		for i := range v {
			v[i] /= norm
		}
		rj := make([]float64, len(q)+1)
		for pass := 0; pass < 2; pass++ { // re-orthogonalise once
			for k, qk := range q {
				d := dot(qk, v)
				rj[k] += d
				for i := range v {
					v[i] -= d * qk[i]
				}
			}
		}
		res := math.Sqrt(dot(v, v))
		if res < 1e-9 {
			continue
		}
		for i := range v {
			v[i] /= res
		}
		rj[len(q)] = res
		q = append(q, v)
		cols = append(cols, j)
		r[j] = rj
		scale[j] = norm
	}
	// R·z = Qᵀy, R upper triangular over cols in order.
	k := len(cols)
	qty := make([]float64, k)
	for i, qi := range q {
		qty[i] = dot(qi, y)
	}
	z := make([]float64, k)
	for i := k - 1; i >= 0; i-- {
		s := qty[i]
		for l := i + 1; l < k; l++ {
			s -= r[cols[l]][i] * z[l]
		}
		z[i] = s / r[cols[i]][i]
	}
	c := make([]float64, n)
	for i, j := range cols {
		c[j] = z[i] / scale[j]
	}
	return c
}

func dot(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// FitError summarises the fit error of a profile's measured points.
type FitError struct {
	// Method says how the coefficients were fitted (FitMethod).
	Method string `json:"method"`
	// Points is how many points carry a rel_err.
	Points int `json:"points"`
	// TotalRelErr is Σ|model − measured| / Σ measured over those points:
	// the error of the total measured time (0.05 = 5%).
	TotalRelErr float64 `json:"total_rel_err"`
	// RMSRelErr is the root mean square of the points' rel_err.
	RMSRelErr float64 `json:"rms_rel_err"`
	// MaxRelErr is the largest |rel_err| of a point.
	MaxRelErr float64 `json:"max_rel_err"`
}

// SetFitErrors sets RelErr of every step_ms point of p to the model's
// relative error (model − measured) / measured and returns the summary
// (Method left empty).
func (p *Profile) SetFitErrors() FitError {
	var f FitError
	var absSum, valSum, sq float64
	for i := range p.Points {
		pt := &p.Points[i]
		if pt.Metric != MetricStepMs {
			continue
		}
		model := p.StepSeconds(pt.Batch()) * 1e3
		e := (model - pt.Value) / pt.Value
		pt.RelErr = &e
		f.Points++
		absSum += math.Abs(model - pt.Value)
		valSum += pt.Value
		sq += e * e
		f.MaxRelErr = max(f.MaxRelErr, math.Abs(e))
	}
	if f.Points > 0 {
		f.TotalRelErr = absSum / valSum
		f.RMSRelErr = math.Sqrt(sq / float64(f.Points))
	}
	return f
}
