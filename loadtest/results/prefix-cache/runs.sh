#!/usr/bin/env bash
# Every run of README.md, in order (from the repository root).
set -euo pipefail
d=loadtest/results/prefix-cache
TR=(--dataset-name mooncake --dataset-path data/mooncake-fast25/synthetic_trace.jsonl
    --mooncake-block-size 512 --trace-replay --trace-skip 3793 --num-prompts 200 --trace-time-scale 1.3)
$d/run.sh prefix        $d/policy-prefix.yaml      480000 -- "${TR[@]}"
$d/run.sh leastloaded   $d/policy-leastloaded.yaml 480000 -- "${TR[@]}"
$d/run.sh roundrobin    $d/policy-roundrobin.yaml  480000 -- "${TR[@]}"
$d/run.sh prefix-nodpc  $d/policy-prefix.yaml      0      -- "${TR[@]}"
$d/run.sh conditional   $d/policy-conditional.yaml 480000 -- "${TR[@]}"
$d/run.sh respcache     $d/policy-leastloaded.yaml 0 --response-cache-entries 1024 -- \
  --dataset-name random --random-input-len 1024 --random-output-len 64 --num-prompts 300 \
  --request-rate 8 --repeat-fraction 0.2 --temperature 0 --save-detailed
