// Package workertest holds the setup the prefill and decode workers'
// tests share: the tiny reference engine they compare against, their
// prompts, a hang guard, and a worker Server served on loopback gRPC with
// its scheduler started now or later and everything stopped at the test's
// end. It imports neither worker (each worker's tests import it), so the
// Server is given by its methods.
package workertest
