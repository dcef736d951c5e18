// Package router chooses the workers of a request, in the shape of
// gateway-api-inference-extension's scheduling framework: per profile,
// filters, then scorers, then a picker.
//
// # A request's path
//
// Route(now, req, decode, prefill, exclude) makes the request's whole
// routing decision (Decision): the decode worker, local or remote
// prefill, the prefill worker, the predicted prefix hit, and the peer the
// worker that prefills may pull the prompt's prefix from. It runs:
//
//  1. The decode profile over the decode (or colocated) workers:
//     - filters draining, excluded, model, context (plugins/draining,
//     plugins/excluded, plugins/modelmatch, plugins/contextlen: each
//     worker's own context length must fit the request); none left:
//     ErrNoDecodeWorkers;
//     - the capacity filter kvroom (plugins/kvroom): drops workers whose
//     estimated free KV blocks are fewer than ⌈(prompt + max tokens) /
//     BlockTokens⌉, unless none has room (the worker's Reserve is the
//     authoritative check, so the router does not refuse on an estimate),
//     then batchroom (plugins/batchroom): drops workers whose estimated
//     running batch has reached their heartbeat's max_batch, unless none
//     has room (a full worker holding a popular prefix would otherwise keep
//     winning on the prefix score while its requests wait for a slot);
//     - scorers, each in [0, 1]: prefix (share of the prompt's full blocks'
//     computation the worker saves: free from engine memory, from its
//     Prefix index, else its PrefixDigest; Config.HostCost each from its
//     host tier, its HostPrefix index; Config.DiskCost each from its disk
//     tier, its DiskPrefix index; or, for a worker whose heartbeat says it
//     pulls, its PeerPullCost each of the deepest prefix any other peer
//     (Request.Peers, else the listed workers) holds in any tier, when
//     that is cheaper), queue (1 − queued prefill
//     tokens / the longest queue), kv (free / total KV blocks), batch (1 −
//     running batch / the largest); a worker's total is Σ weight × score
//     (Config.Decode, default DefaultDecodeWeights: prefix 1, kv 1,
//     batch 0.01);
//     - the picker (plugins/maxscore): the highest total, ties by the
//     lowest id.
//  2. The Decider (see its doc for the exact rule) decides on the
//     prompt's uncached tokens, u = prompt − the chosen decode worker's
//     prefix hit: u < LocalPrefillBelowTokens prefills on the decode
//     worker; so does u < BusyLocalPrefillBelowTokens when every eligible
//     prefill worker has PrefillQueueLocalTokens or more queued. Colocated
//     mode and Request.Local always prefill locally; Request.DecodeOnly
//     stops after step 1.
//     Once the decode worker's Reserve answers its real hit, the pure
//     function Revise applies rule 1 to that hit (Decision.ShortBelow):
//     it may turn a remote decision local, never the other way; the
//     caller tells the Router with Revised (the prefill worker's queue
//     no longer counts the prompt; placement "local_reserved").
//  3. For a remote prefill, the prefill profile over the prefill workers:
//     the same eligibility filters (none left: ErrNoPrefillWorkers), the
//     Decider's busy rule, the capacity filter queuelimit
//     (plugins/queuelimit, MaxQueuedPrefillTokens; none left:
//     ErrNoCapacity), the scorers prefix, queue and batch (Config.Prefill,
//     default DefaultPrefillWeights: prefix 4, queue 1; prefill workers
//     report no KV) and the picker.
//  4. The pulls: the deepest holder of the prompt's prefix in any tier
//     (engine, host, disk) among the peers (Request.Peers: every live
//     worker that keeps prompts, whatever its role; nil: the decode and
//     prefill workers given), other than the worker that would pull, when
//     it holds more than that worker and has an address: Decision.Peer
//     for the worker that prefills, Decision.LocalPeer for the decode
//     worker (what Revise puts in Peer). The scorers' peer credit and the
//     pulls come from the same search. The pulling worker decides by its
//     own link model whether to pull.
//
// # Policies
//
// The default weights are prefix-aware: a follow-up whose prompt shares a
// prefix with an earlier one goes to the prefill worker that still holds
// it unless 4 × the share of the prompt it holds is less than the other's
// lead in queue score (at most 1); where the other pulls prefixes from
// peers, the holder's lead in prefix score is only its share of the
// prompt × the other's pull cost (the prefix is pulled, not recomputed),
// so a busy holder loses the prompt sooner; and to the decode worker holding it
// unless the share is less than the other's lead in free KV share. Their
// values are the best of a sweep on the Mooncake trace
// (loadtest/results/router-weights/: hit ratio, TTFT p95 and goodput,
// two runs each).
// Least-loaded routing (prefix caches ignored) is LeastLoadedDecodeWeights
// and LeastLoadedPrefillWeights; round-robin is PickerRoundRobin.
//
// The plugin interfaces (Filter, Scorer, Picker) and the Candidate they
// see are defined in package framework, which the plugins import, and
// re-exported here. Config.DecodeProfile and Config.PrefillProfile
// replace the default profiles (DefaultProfiles). The framework, not the
// plugins, times every plugin call: with Config.Registerer set, the
// durations go to pdserve_router_plugin_duration_seconds{profile,plugin,
// kind} (kind filter, scorer or picker), measured with Config.Clock; the
// placements to pdserve_router_decisions_total{placement}.
//
// # Determinism and load between heartbeats
//
// The Router is a deterministic core: it takes the time and the workers'
// heartbeat snapshots as inputs, never reads a clock for a decision (the
// clock only measures plugin durations) and does no I/O, so the same
// inputs always give the same choice. Between heartbeats it tracks its
// own assignments: an assignment made after a worker's snapshot was taken
// counts against that worker (KV blocks, running batch, queued prefill
// tokens) until a newer snapshot arrives or the request is Done, so a burst
// arriving between two heartbeats spreads over the workers instead of
// piling onto the one that looked emptiest. Candidates carry these
// estimates (Candidate.Load). Snapshot times come from the workers'
// clocks; on one host, or with synchronised clocks, that is exact enough
// (an error of a few ms only shifts how long an assignment counts).
//
// The router only estimates KV capacity; the decode worker's Reserve is the
// authoritative check. A caller whose Reserve fails routes again with that
// worker excluded.
//
// Router is safe for concurrent use; Route runs one cycle at a time.
package router
