package flagvocab

// Meanings says, for each flag name registered more than once with
// different usage texts (in the flag sets of several binaries or
// subcommands), the one thing it means in all of them. A name registered
// once (one AddFlags shared by several binaries) needs no entry: its
// usage is its meaning. Check fails on a name with several registrations
// and no entry here, and on an entry that no longer applies.
var Meanings = map[string]string{
	"attainment":              "fraction of requests that must meet both SLOs (TTFT and TPOT), in (0, 1]",
	"base-url":                "root URL of the OpenAI-compatible server under test",
	"block-tokens":            "tokens per KV block, of the prefix hashes, prefix reuse and the KV pool; one value for the coordinator and every worker",
	"budget":                  "wall time a measurement may take",
	"burstiness":              "gamma shape of the requests' inter-arrival times (1 = Poisson, < 1 burstier)",
	"codec":                   "KV codec of the transfers between the pools: none, s2, zstd, bf16, fp8, int8, auto or auto-lossy",
	"ctx-size":                "llamacpp engine: KV cache tokens of a worker",
	"elastic":                 "workers started elastic: the coordinator's role commands (and its planner's, with --planner-roles) may move them between prefill, decode and colocated with their models loaded (a worker binary: that worker; coordinator --standalone: its in-process workers)",
	"engine":                  "engine: ref, sim or llamacpp",
	"first-token-policy":      "which worker's first token the client gets: prefill (kv_transfer in the first inter-token gap) or decode (kv_transfer in TTFT)",
	"gpu-budget":              "most GPUs (cores, with CPU profiles) the two pools may use together",
	"gpu-cost-per-hour":       "USD per GPU-hour (per core-hour with CPU profiles); the coordinator's deprecated flag sets its policy's pricing.gpu_usd_per_hour",
	"gpus":                    "GPUs of the deployment, all in use: its workers × tp (coordinator plan --window: the fixed pool each window splits between prefill and decode)",
	"host-cache-bytes":        "bytes of true KV in a worker's host-memory prefix-cache tier",
	"kv-hash-key-file":        "file holding the deployment's secret that keys the prompts' KV block hashes; the same file for the coordinator and every worker",
	"kv-blocks":               "KV blocks in a decode or colocated worker's pool",
	"link-gbps":               "bandwidth of the KV link between the pools, per worker and direction, Gbit/s: the planner models it, local deployments (loadtest, chaos) emulate it",
	"llama-lib":               "directory of llama.cpp's shared libraries",
	"local":                   "start a local deployment, colocated or disaggregated, instead of using --base-url",
	"max-batch":               "most sequences in one step of a decode or colocated worker (coordinator profile: the largest it measures)",
	"max-batch-tokens":        "token budget of one step, summed over the batch (coordinator plan: of the colocated workers it plans; 0 searches)",
	"max-seqs":                "llamacpp engine: sequences a worker holds at once",
	"policy":                  "the coordinator's policy file (YAML: SLOs, limits, budgets, tiers, objectives); coordinator plan plans the models of its tiers",
	"model-name":              "the model's name: served in the API (coordinator), the model part of a profile's name (coordinator profile); default the model's own",
	"nats-url":                "NATS URL of the control plane",
	"no-repack":               "llamacpp engine: keep the weights in their file layout",
	"out":                     "file the command writes its result (JSON) to",
	"output":                  "format of what the command prints on stdout: table or json",
	"pace-gbps":               "pace the worker's KV transfers as over a link of this many Gbit/s (0: no pacing)",
	"payload-scale":           "sim engine: fraction of the true KV bytes generated and moved",
	"peer-link-gbps":          "Gbit/s a pull of a cached prefix from a peer worker is priced at until such pulls were measured",
	"prefix-cache-tokens":     "KV tokens of finished prompts a worker keeps in engine memory for prefix reuse (-1: its KV memory; 0: none)",
	"preset":                  "ref engine model preset",
	"profile":                 "performance-model profile, GPU/MODEL/tpN or a profile JSON file",
	"peer-pull-verify-blocks": "blocks of each KV prefix a worker pulled from a peer that it recomputes and compares with what the peer sent (0: no check; the pulled KV then serves its own request only)",
	"queue-limit":             "the coordinator's admission limit, its policy's limits.queue_limit (coordinator: deprecated, loadtest: of its local deployments)",
	"request-timeout":         "time limit of one request",
	"time-scale":              "performance-model time scale: wall time = modelled time × scale",
	"slo-ttft":                "time-to-first-token SLO the command plans or measures against",
	"slo-tpot":                "time-per-output-token SLO the command plans or measures against",
	"planner-role-dwell":      "the online planner's least time between two role moves",
	"planner-role-min-gain":   "the online planner's least predicted SLO attainment gain (a fraction) of a role move",
}

// Synonyms maps a flag name to the flag name it means, where a binary
// still uses another name for one meaning (to rename).
var Synonyms = map[string]string{
	"queue-limit": "max-admitted-requests", // loadtest: the coordinator's admission limit of its local deployments; the coordinator's deprecated flag of limits.queue_limit, as --max-admitted-requests
}

// Clashes are the names known to carry two meanings still, each with why
// it is left. Check fails when another name carries two, and when one of
// these no longer does (then its entry goes): the list only shrinks.
var Clashes = map[string]string{
	"chunk-tokens": "coordinator plan's former name of --max-batch-tokens (the step budget), kept warning for one release; the workers' --chunk-tokens is one sequence's chunk",
	"seed":         "the ref engine's weight seed (coordinator, workers, coordinator profile) against the seed of the simulated or sent requests (coordinator plan, loadtest); to rename one",
	"model":        "the engines' GGUF model file against the model name loadtest sends (vLLM's benchmark calls it --model; the coordinator --model-name); to rename loadtest's",
	"max-tokens":   "coordinator profile's longest context measured against loadtest check's max_tokens of its completion; to rename profile's",
}
