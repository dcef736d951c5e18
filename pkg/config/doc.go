// Package config loads the coordinator's serving policy from YAML: SLO
// targets, prompt-token budgets per API key and per route, the max_tokens
// cap and default (both relative to the model's context by default), the
// admission limit, the routing thresholds, the pricing of requests and
// the files that authenticate clients.
//
// A policy file is optional; every field has a built-in default (see
// Default). It is the one place of these settings: the coordinator's
// former flags of some of them (coordinator.PolicyFlags) are deprecated,
// and override the file only where given; its --api-keys and
// --metrics-token-file name the auth files instead of auth. Policy values are plain data: safe to copy and to read from many
// goroutines once loaded.
//
// Example file:
//
//	slo:
//	  ttft_ms: 500        # time to first token target, milliseconds
//	  tpot_ms: 50         # time per output token target, milliseconds
//	  attainment: 0.9     # share of requests meeting both, for the planner (0: 0.9)
//	limits:
//	  max_tokens_cap: 2048    # per choice; 0 (default): the rest of the context
//	  default_max_tokens: 256 # without max_tokens; 0 (default): the rest of the context, capped
//	  queue_limit: 256    # requests admitted at once; more get 429
//	prompt_budgets:       # prompt tokens allowed per request, by surface
//	  default: 8192
//	  routes:
//	    /v1/chat/completions: 4096
//	  api_keys:           # by key name with auth.api_keys_file, else by the key itself
//	    team-a: 1024
//	routing:                          # package router; its doc has the rules
//	  local_prefill_below_tokens: 0   # prompts with fewer uncached tokens prefill on the decode worker
//	  max_queued_prefill_tokens: 0    # per prefill worker; 0 = unbounded
//	  prefill_queue_local_tokens: 0   # when every prefill worker queues this many tokens…
//	  busy_local_prefill_below_tokens: 0 # …prompts with fewer uncached tokens prefill locally (both or neither)
//	  weights:                        # Σ weight × score, scores in [0, 1]; unset: these defaults (prefix-aware)
//	    decode: {prefix: 1, queue: 0, kv: 1, batch: 0.01}
//	    prefill: {prefix: 4, queue: 1, batch: 0}
//	  # least-loaded: prefix 0 in both profiles (LeastLoadedYAML)
//	  picker: maxscore                # or roundrobin: in turn by worker id, no weights set
//	  recent_prompt_ms: 10000         # an ended prompt counts as held by its workers this long (0: off)
//	auth:                 # optional: authenticated clients (package apikey); none by default
//	  api_keys_file: keys.txt         # sha256:<hex> [name=…] [rpm=…] [tpm=…] per line; relative to this file
//	  metrics_token_file: metrics.tok # the bearer token /metrics requires
//	pricing:              # optional: the cost of each request ($, $/1k tokens); none by default
//	  gpu_usd_per_hour: 2.5           # USD per GPU-hour, × the GPU-seconds a request used
//	  prefill_gpus_per_worker: 1      # GPUs of one prefill worker (0: 1)
//	  decode_gpus_per_worker: 1       # GPUs of one decode or colocated worker (0: 1)
//	  # or, instead of a GPU price, prices per 1000 tokens:
//	  # prompt_usd_per_1k_tokens: 0.0005
//	  # output_usd_per_1k_tokens: 0.0015
//	tiers:                # optional: model aliases clients request (package tiers)
//	  chat:
//	    models: [llama-3-8b-q4, llama-3-70b] # the first predicted to meet the budget serves
//	objectives:           # optional: TTFT budgets and priorities (Objectives)
//	  default: {ttft_budget_ms: 1000, priority: interactive}
//	  api_keys:
//	    nightly: {priority: batch}
//	  batch_share: 0.5    # of queue_limit that batch requests may hold
package config
