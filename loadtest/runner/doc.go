// Package runner sends a workload's requests on a schedule, at most
// MaxConcurrency at a time, and collects their outcomes in workload order.
// As in vllm bench serve, a request is due at its scheduled offset and then
// waits for a concurrency slot, so an open-loop schedule turns into a closed
// loop under a tight limit (an infinite rate with a limit is a fixed
// concurrency). Time comes from a Clock, so tests run in virtual time.
package runner
