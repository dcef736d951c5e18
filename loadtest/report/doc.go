// Package report writes benchmark results: the result JSON with vllm bench
// serve's field names plus a "pdserve" section (the server-side budget),
// Markdown summaries for one run, a rate sweep and a side-by-side
// comparison, and the regression check of a result against a baseline.
// Everything is written to an io.Writer the caller owns; nothing here
// reads the clock except Meta.Date, which the caller fills.
package report
