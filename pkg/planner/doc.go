// Package planner sizes the prefill and decode pools of a disaggregated
// deployment, and compares it with colocated serving at equal GPUs, so that
// goodput per GPU — the highest request rate at which a target fraction of
// requests meets both the TTFT and the TPOT SLO, divided by the GPUs used —
// is as high as the hardware allows.
//
// # Model
//
// A discrete-event simulation of the serving system, driven by the step-time
// model of package perfmodel (the same one the performance-model engine
// uses):
//
//   - disaggregated: as the router does, a request first reserves its
//     prompt+output tokens of KV on the decode worker with the fewest
//     requests among those with room (waiting at the coordinator while
//     none has), then joins the prefill worker with the fewest queued
//     prompt tokens; a prefill worker runs batches of whole prompts up to
//     a token limit; each prompt's KV streams layer by layer while the
//     prefill runs, through the sender's egress and then the receiver's
//     ingress (each a FIFO link of the given bandwidth per worker),
//     compressed by a codec of given ratio and per-core speed; a decode
//     worker runs continuous batches of at most a batch limit;
//   - colocated: each worker runs chunked prefill mixed into its decode
//     batches (Sarathi-Serve / vLLM style) with a token budget per step, or,
//     with chunking off, prefill-priority steps of whole prompts (vLLM
//     without chunked prefill, DistServe's baseline).
//
// Arrivals follow a gamma process of the asked rate and burstiness (shape 1
// is Poisson) or a trace's own inter-arrival gaps rescaled to the rate;
// lengths are drawn from the workload's empirical distribution. A fixed seed
// gives every candidate the same requests (common random numbers), so
// candidates are compared on equal terms and results are repeatable. A run
// simulates enough requests for its arrivals to span four request
// lifetimes (TTFT SLO + mean output × TPOT SLO; at least Config.Requests,
// at most ten times that) and measures only those arriving after a
// warm-up and before a drain of one lifetime each (a tenth of the span
// each when that is shorter).
//
// # Prefix caches
//
// A workload that names its prompts' blocks (a Mooncake trace's hash_ids,
// Workload.Blocks) is replayed in trace order, and Config.Cache simulates
// the workers' prefix caches on it: per worker an LRU of blocks in an
// engine tier (by default the profile's KV memory) and a host tier, the
// router's default prefix-aware scoring (or least-loaded), hit tokens
// removed from the prefill work (priced as a prefill over a cached
// context), host-tier hits loaded over the host link before the step, and
// the decode worker's cached prefix not sent. SweepCache plans each of a
// few cache sizes to show what each buys. The zero Cache, and any
// workload without blocks, plan exactly as without caches. See Cache for
// what is and is not modelled.
//
// # Budget and policies
//
// Every simulated request records the DESIGN's boundaries, and the TTFT
// budget is reported term by term: ingress, queue (the prefill queue and
// any wait for decode memory, where the router puts it), prefill,
// kv_transfer (KV done − prefill end: the part of the transfer not hidden
// behind prefill compute, waits for a busy link included) and first_token
// (joining the decode batch and its first step). With first-token policy "decode" the
// first token comes from the decode worker and kv_transfer is part of TTFT;
// with "prefill" it leaves the prefill worker at once and the transfer lands
// in the first inter-token gap (TPOT).
//
// # Search
//
// For every (prefill, decode) pair and every colocated count within the GPU
// budget, a binary search on the rate finds the highest rate whose simulated
// SLO attainment reaches the target; candidates whose analytic capacity bound
// cannot beat the best found are skipped. The plan also fixes the batching
// limits that protect the SLO: the largest decode batch whose step fits the
// TPOT SLO, the prefill tokens per step whose step fits half the TTFT SLO,
// and the colocated chunk budget that gives the most goodput.
//
// # Objective
//
// Without a rate the plan recommends the design with the highest goodput
// per GPU; with Config.Rate, the design with the fewest GPUs that meets
// the SLO at that rate (at equal GPUs, the higher max rate). Plan.Objective
// and the report say which decided, and the report compares the designs
// on that objective.
//
// # Codec figures
//
// A codec's ratio and per-core speeds come from a CodecProfile: data
// measured by the codec self-benchmark the prefill workers run for
// --codec auto (pkg/kv/codec SelfBench), on the machine whose CPUs will
// code KV (`coordinator codecs --out FILE`), or the built-in profile
// (codecs/default.json, which names the command and CPU that measured
// it). A plan never times the machine it runs on unless asked
// (CodecProfileSelf), so the same inputs give the same plan byte for byte
// on a quiet or a busy machine. "none" costs no CPU time: only the link
// limits it. Plan.Codec.Source says where the figures came from.
//
// # Range
//
// Step times come from a fit; beyond the profile's data points (measured
// by `coordinator profile`, or the calibration points of a profile from a
// paper) they are extrapolated. Plan.Warnings names every profile whose
// points the workload or the simulated steps leave (prompt length,
// prefill tokens per step, decode batch, decode context); a profile with
// no step-time points of its own shape gets a note that its range is
// unknown instead, since there is nothing to compare with.
//
// # CPU deployments
//
// A CPU profile (perfmodel.DeviceCPU, measured by `coordinator profile`)
// makes every GPU count a core count: a worker takes its profile's
// threads, Config.GPUBudget is the cores the pools may use,
// GPUCostPerHour the price of a core-hour, and the plan's Unit says
// "core". The three profiles of a Config are all GPU or all CPU ones; the
// colocated profile may have another thread count. GPU planning is
// unchanged.
//
// # Online
//
// Online keeps a sliding window of observed requests, corrects the model by
// the observed/predicted ratios of prefill time, decode step time and
// transfer time, re-plans every interval and publishes the desired replicas,
// with a cooldown, a stabilization count and scale-down hysteresis so that
// it does not flap.
//
// With OnlineConfig.Roles (elastic workers, which change role without
// reloading their model) it first moves workers between the pools at
// their total: each re-plan simulates every split of the live workers at
// the planned rate and moves to the best one when its predicted
// attainment gain is at least MinGain and the last move is MinDwell old,
// never leaving a role without a worker (Decision.Roles, the RoleActuator,
// pdserve_planner_role_moves_total and pdserve_planner_role_attainment).
// A target of the same total is left to the moves; the total changes only
// when the load or the budget asks for another. One window after a move,
// its decision carries the attainment measured over the window before it
// and the window since (RoleEffect).
//
// Everything but Online.Run is deterministic and takes time as an input.
// Config, Workload and Plan values are not modified by the functions that
// read them; Online is safe for concurrent use.
package planner
