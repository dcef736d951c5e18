// Package arrival makes send schedules: the offset of each request from the
// start of a run. Processes: Poisson and gamma (vLLM's --request-rate and
// --burstiness: gamma intervals with shape = burstiness and mean 1/rate, so
// the coefficient of variation of the intervals is 1/√burstiness; burstiness
// 1 is Poisson), trace timestamps (optionally time-scaled), and all at once
// (an infinite rate, for fixed concurrency under --max-concurrency). The
// functions are pure: a seed makes a schedule repeatable.
package arrival
