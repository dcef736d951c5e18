#!/usr/bin/env bash
# The planner's prediction with prefix caching against measured runs
# (issue 27, Measure: the planner's prediction). The Mooncake slice of
# loadtest/results/prefix-cache/ (rows 3793-3992), sim engine
# h100/llama-3-8b with a 128k context, 4 prefill + 3 decode workers, every
# prefix cache at its default size, the default (prefix-aware) routing;
# one run per time scale of the trace's gaps (SCALES, default "1.6 1.3
# 1.0"), through prefix-cache/run.sh; then `coordinator plan --design
# 4P+3D` at each run's rate on the same slice.
#
# usage (from the repository root): loadtest/results/planner-prefix/run.sh
# BIN as in prefix-cache/run.sh (built once here otherwise). SKIP_RUNS=1
# only re-runs the predictions against the saved results; SWEEP=1 also
# writes the cache-size sweeps.
set -euo pipefail
d=loadtest/results/planner-prefix
trace=data/mooncake-fast25/synthetic_trace.jsonl
profile=loadtest/results/prefix-cache/h100-llama-3-8b-128k-tp1.json
scales=(${SCALES:-1.6 1.3 1.0})
if [[ -z ${BIN:-} ]]; then
  BIN=$(mktemp -d); go build -o "$BIN/" ./cmd/coordinator ./cmd/prefill-worker ./cmd/decode-worker ./loadtest
fi
export BIN OUT=$d PREFILL_PREFIX_TOKENS=-1 DECODE_WORKERS=3
tmp=$(mktemp -d)
sed -n 3794,3993p "$trace" >"$tmp/slice.jsonl" # rows 3793-3992, 0-based
echo "# the default policy" >"$tmp/default.yaml"
# measured-xS: the router on the workers' KV events (the default);
# measured-digest-xS: on their heartbeat digests (--kv-events=false).
if [[ -z ${SKIP_RUNS:-} ]]; then
  for s in "${scales[@]}"; do
    for kind in measured:"" measured-digest:--kv-events=false; do
      name=${kind%%:*}-x$s
      WORKER_FLAGS=${kind#*:} loadtest/results/prefix-cache/run.sh "$name" "$tmp/default.yaml" -1 -- \
        --dataset-name mooncake --dataset-path "$trace" --mooncake-block-size 512 --trace-replay \
        --trace-skip 3793 --num-prompts 200 --trace-time-scale "$s" --save-detailed --no-plots >/dev/null
      # Keep the per-request TTFTs and arrivals; drop the texts and inter-token gaps.
      python3 -c 'import json, sys; f = sys.argv[1]; r = json.load(open(f)); [r.pop(k, None) for k in ("itls", "generated_texts")]; json.dump(r, open(f, "w"), indent=2)' "$d/$name.json"
      echo "$name done" >&2
    done
  done
fi
# The slice's own rate (its planner workload's), divided by each scale.
rate=$(awk -F'"timestamp": ' 'NR==1{split($2,a,",");t0=a[1]} {split($2,a,",");t=a[1]} END{printf "%.6f", (NR-1)/((t-t0)/1000)}' "$tmp/slice.jsonl")
for s in "${scales[@]}"; do
  r=$(awk -v r="$rate" -v s="$s" 'BEGIN{printf "%.4f", r/s}')
  "$BIN/coordinator" plan --profile "$profile" --workload "$tmp/slice.jsonl" --slo-ttft 5s --slo-tpot 100ms \
    --design 4P+3D --rate "$r" --requests 200 --output json >"$d/predicted-x$s.json"
  "$BIN/coordinator" plan --profile "$profile" --workload "$tmp/slice.jsonl" --slo-ttft 5s --slo-tpot 100ms \
    --design 4P+3D --rate "$r" --requests 200 --prefix-cache-tokens 0 --output json >"$d/predicted-nocache-x$s.json"
done
# SWEEP=1: what each cache size buys at the 1.3 rate, with the default
# engine tier and with a 32k-token one (a few minutes each).
if [[ -n ${SWEEP:-} ]]; then
  for e in auto:-1 32k:32768; do
    "$BIN/coordinator" plan --profile "$profile" --workload "$tmp/slice.jsonl" --slo-ttft 5s --slo-tpot 100ms \
      --rate 3.15 --prefix-cache-tokens "${e#*:}" >"$d/sweep-3.15-engine-${e%%:*}.txt"
  done
fi
python3 "$d/summarize.py" "${scales[@]}"
