#!/usr/bin/env bash
# Sweep of the router's prefix weights on the Mooncake slice of
# loadtest/results/prefix-cache/ (rows 3793-3992, replay x1.3 = 3.15 req/s,
# 4 prefill + 2 decode sim workers, h100/llama-3-8b with a 128k context),
# with every worker's prefix cache at its default size (--prefix-cache-tokens
# -1, auto). One run per weight pair, through prefix-cache/run.sh.
#
# usage (from the repository root):
#   loadtest/results/router-weights/sweep.sh [RUN...]
# RUN is NAME=DECODE_PREFIX:PREFILL_PREFIX (a policy with those prefix
# weights, decode kv 1 and batch 0.01, prefill queue 1), NAME=roundrobin,
# or NAME=default (the default policy, no routing section); no RUN: the
# grid of README.md. SUFFIX is appended to every NAME (a repeat: SUFFIX=-r2).
# BIN as in run.sh; built once here otherwise.
set -euo pipefail
d=loadtest/results/router-weights
TR=(--dataset-name mooncake --dataset-path data/mooncake-fast25/synthetic_trace.jsonl
    --mooncake-block-size 512 --trace-replay --trace-skip 3793 --num-prompts 200 --trace-time-scale 1.3)
runs=("$@")
if [[ ${#runs[@]} -eq 0 ]]; then
  runs=(leastloaded=0:0 d1-p0.25=1:0.25 d1-p0.5=1:0.5 d1-p1=1:1 d1-p2=1:2 d1-p4=1:4 d1-p8=1:8
        d0-p1=0:1 d0-p4=0:4 d4-p1=4:1 d4-p4=4:4 roundrobin=roundrobin default=default)
fi
if [[ -z ${BIN:-} ]]; then
  BIN=$(mktemp -d); go build -o "$BIN/" ./cmd/coordinator ./cmd/prefill-worker ./cmd/decode-worker ./loadtest
fi
export BIN OUT=$d PREFILL_PREFIX_TOKENS=-1
pol=$(mktemp -d)
for r in "${runs[@]}"; do
  name=${r%%=*}${SUFFIX:-} w=${r#*=}
  case $w in
    default) echo "# the default policy" >"$pol/$name.yaml" ;;
    roundrobin) echo "routing: {picker: roundrobin}" >"$pol/$name.yaml" ;;
    *) printf 'routing:\n  weights:\n    decode: {prefix: %s, kv: 1, batch: 0.01}\n    prefill: {prefix: %s, queue: 1}\n' \
         "${w%%:*}" "${w#*:}" >"$pol/$name.yaml" ;;
  esac
  cp "$pol/$name.yaml" "$d/$name.policy.yaml"
  loadtest/results/prefix-cache/run.sh "$name" "$pol/$name.yaml" -1 -- "${TR[@]}" --no-plots >/dev/null
  echo "$name done" >&2
done
