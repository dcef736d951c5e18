// Package sweep finds the highest request rate at which a deployment meets
// an SLO-attainment target: it probes a grid of rates (each probe is a full
// benchmark run), then narrows the bracket between the highest passing and
// the lowest failing rate by bisection (or, when every grid rate passes,
// first doubles past the grid). It assumes attainment falls as the rate
// rises; a non-monotone curve is reported as probed, and the answer is the
// highest passing rate below the first failing one. The search is pure
// given its probe.
package sweep
