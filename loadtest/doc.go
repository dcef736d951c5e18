// Command loadtest is pdserve's load generator and benchmark CLI: it drives
// any OpenAI-compatible endpoint with a workload (random, length
// distributions, ShareGPT, Azure and Mooncake traces) on an arrival process,
// measures client-side latencies with vLLM's definitions, and reports them
// (Markdown, vLLM-compatible result JSON with the server-side budget, PNG
// plots). Subcommands: run, sweep (attainment curve and max rate per GPU),
// compare (disaggregated vs colocated at equal GPUs), regress (fail on
// TTFT/TPOT drift against a baseline) and shift (a trace whose mix moves:
// fixed splits, the planner replacing pods, elastic roles). See README.md.
package main
