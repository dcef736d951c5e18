package perfmodel

import (
	"errors"
	"fmt"
	"math"
)

// ErrFit reports measured points from which no coefficients can be fitted
// (too few, or not spread enough); match with errors.Is.
var ErrFit = errors.New("perfmodel: cannot fit")

// FitMethod describes what FitDistServe does, for Measurement.Fit.Method.
const FitMethod = "distserve form; least squares on relative error (rows weighted 1/measured); " +
	"non-negative coefficients (a negative one is fixed at 0 and the rest refitted); " +
	"prefill, decode and mixed points fitted jointly, mixed steps paying max(a_p, a_d) once " +
	"plus a mixed-step interaction m0 + m1·Σn + m2·Σl·Σn fitted on the mixed points; one decode regime"

// minGroupPoints is the fewest distinct prefill-only and decode-only
// points a fit needs: three coefficients each.
const minGroupPoints = 3

// FitDistServe fits the DistServe form (see DistServe and StepSeconds) to
// measured step_ms points: prefill-only points fix a_p, b_p, c_p;
// decode-only points a_d, b_d, c_d; mixed points (prefill chunks and
// decode tokens in one step) enter the same fit with the fixed cost
// max(a_p, a_d), whichever is larger, and alone fix the interaction
// coefficients Mixed (m0, m1, m2), which are 0 without mixed points. The
// fit minimises
// Σ ((model − measured) / measured)², the squared relative errors, so
// that short and long steps count alike; a coefficient that comes out
// negative is fixed at 0 and the others refitted, so that no term
// predicts negative time. A measured profile has one decode regime: the
// result's DecodeSmall equals DecodeLarge (LargeBatchThreshold 1).
//
// Points of other metrics are ignored. Errors: ErrFit when fewer than
// three distinct prefill-only or decode-only points are given.
func FitDistServe(points []Point) (*DistServe, error) {
	var pre, dec, mix []fitRow
	seenP, seenD := map[[2]float64]bool{}, map[[2]float64]bool{}
	for _, pt := range points {
		if pt.Metric != MetricStepMs {
			continue
		}
		r := rowOf(pt)
		switch {
		case r.nP > 0 && r.nD == 0:
			pre = append(pre, r)
			seenP[[2]float64{r.sumL, r.sumQ}] = true
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
	// Stage 1: each group alone; its fixed costs say which one a mixed
	// step pays.
	cp := nnls(design(pre, false), targets(pre))
	cd := nnls(design(dec, false), targets(dec))
	coef := append(append(append([]float64{}, cp[:3]...), cd[3:6]...), 0, 0, 0)
	if len(mix) > 0 {
		// Stage 2: all points together, for each choice of the larger
		// fixed cost; keep the consistent choice of least error.
		best := math.Inf(1)
		for _, prefillFixed := range []bool{coef[0] >= coef[3], coef[0] < coef[3]} {
			rows := append(append(append([]fitRow{}, pre...), dec...), mix...)
			a := design(rows, prefillFixed)
			c := nnls(a, targets(rows))
			if (c[0] >= c[3]) != prefillFixed && c[0] != c[3] {
				continue
			}
			if e := sse(a, c, targets(rows)); e < best {
				best, coef = e, c
			}
		}
	}
	d := &DistServe{LargeBatchThreshold: 1}
	copy(d.Prefill[:], coef[:3])
	copy(d.DecodeSmall[:], coef[3:6])
	copy(d.Mixed[:], coef[6:])
	d.DecodeLarge = d.DecodeSmall
	return d, nil
}

// fitRow is one point's sums in the DistServe form, and its value in ms.
type fitRow struct {
	nP, nD, sumL, sumQ, sumN, ms float64
}

func rowOf(pt Point) fitRow {
	b := pt.Batch()
	r := fitRow{nP: float64(len(b.Prefill)), nD: float64(len(b.Decode)), ms: pt.Value}
	for i := range b.Prefill {
		l, c := b.chunk(i)
		r.sumL += l
		r.sumQ += (c+l)*(c+l) - c*c
	}
	for _, n := range b.Decode {
		r.sumN += float64(max(n, 0))
	}
	return r
}

// design returns the weighted design matrix of rows over the nine
// coefficients (a_p, b_p, c_p, a_d, b_d, c_d, m0, m1, m2); a mixed row pays
// a_p when prefillFixed, else a_d, and is the only kind with m0, m1, m2.
// Each row is divided by its measured value, so that least squares
// minimises relative errors.
func design(rows []fitRow, prefillFixed bool) [][]float64 {
	a := make([][]float64, 0, len(rows))
	for _, r := range rows {
		w := 1 / r.ms
		x := make([]float64, 9)
		if r.nP > 0 {
			x[1], x[2] = r.sumL*w, r.sumQ*w
		}
		if r.nD > 0 {
			x[4], x[5] = r.sumN*w, r.nD*w
		}
		if r.nP > 0 && r.nD > 0 {
			x[6], x[7], x[8] = w, r.sumN*w, r.sumL*r.sumN*w
		}
		switch {
		case r.nD == 0, r.nP > 0 && prefillFixed:
			x[0] = w
		default:
			x[3] = w
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
