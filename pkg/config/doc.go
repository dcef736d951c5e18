// Package config loads the coordinator's serving policy from YAML: SLO
// targets, prompt-token budgets per API key and per route, the max_tokens
// cap and default, the admission limit and the routing thresholds.
//
// A policy file is optional; every field has a built-in default (see
// Default), and the coordinator's flags override the file where they are
// set. Policy values are plain data: safe to copy and to read from many
// goroutines once loaded.
//
// Example file:
//
//	slo:
//	  ttft_ms: 500        # time to first token target, milliseconds
//	  tpot_ms: 50         # time per output token target, milliseconds
//	  attainment: 0.9     # share of requests meeting both, for the planner (0: 0.9)
//	limits:
//	  max_tokens_cap: 2048
//	  default_max_tokens: 16
//	  queue_limit: 256    # requests admitted at once; more get 429
//	prompt_budgets:       # prompt tokens allowed per request, by surface
//	  default: 8192
//	  routes:
//	    /v1/chat/completions: 4096
//	  api_keys:
//	    team-a-key: 1024
//	routing:
//	  local_prefill_below_tokens: 0   # shorter prompts prefill on the decode worker
//	  max_queued_prefill_tokens: 0    # per prefill worker; 0 = unbounded
//	  prefix_weight: 0                # tokens of prefix-cache hit worth one queued token
package config
