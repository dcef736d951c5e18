// Package sweep finds the request rate at which a deployment's SLO
// attainment crosses a target: it probes a grid of rates (each probe is a
// full benchmark run), then doubles past the grid (or halves below it)
// until the crossing is bracketed, and bisects the bracket between the
// last rate meeting the target and the first rate failing it until that
// interval is within a relative tolerance (5 % by default). Attainment
// need not fall monotonically with the rate (it is measured on a finite
// number of requests): the crossing is the split of the probes that
// misclassifies the least, weighted by each probe's distance from the
// target, and the probes on its wrong side are reported as outliers. The
// search is pure given its probe, and the rates it probes follow from the
// grid and the pass/fail outcomes alone.
package sweep
