// Package deploy starts a pdserve deployment inside the load generator's
// process for benchmarks: the coordinator in standalone mode with its
// workers (disaggregated: P prefill + D decode workers; colocated: N
// colocated workers doing chunked prefill mixed into decode steps), on the
// performance-model engine by default, on loopback ports chosen by the
// system. A Spec says exactly what runs; Facts lists it for reports.
package deploy
