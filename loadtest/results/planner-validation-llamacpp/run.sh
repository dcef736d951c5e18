#!/usr/bin/env bash
# The planner checked against a real engine it does not simulate (issue 16):
# profile llama.cpp on this machine's cores, predict SLO attainment with
# `coordinator plan` on that profile, and measure it on separate pinned
# worker processes.
#
# usage (from the repository root):
#   loadtest/results/planner-validation-llamacpp/run.sh [profile|1p1d|colocated|plan|refit|repredict]...
# (no argument: the first four, in that order; plan writes the
# recommendation on the 2-core budget, plan-budget2.json; refit fits the
# profiles' stored points again with this version's fit, and repredict
# redoes every prediction of RESULTS from its measured runs and profiles:
# neither runs an engine). BIN: directory with coordinator,
# prefill-worker, decode-worker, loadtest and mkgguf (default: built into a
# temporary directory). RATES_1P1D / RATES_COLOCATED: rates in req/s. N: requests
# per rate (default 100). RESULTS: where results go (default this directory;
# the profiles are read from there, so copy them first).
#
# The model is Qwen2.5-0.5B's shape with random weights (cmd/mkgguf, seed 1,
# q8_0, tied embeddings: 494M parameters), so its text is gibberish; step
# times are those of the real shape. Cores: 1P+1D pins the prefill worker to
# CPU 0 and the decode worker to CPU 1 (1 thread each, profile-t1.json);
# colocated runs one worker on both CPUs with 2 threads (profile-t2.json).
# The coordinator and the load generator are not pinned. profile-t1.json is
# measured on CPU 0 while a second profile keeps CPU 1 busy with llama.cpp
# steps, as the decode worker keeps it in 1P+1D: the two workers share the
# memory bandwidth and caches, which slows a prefill step by 3–7% here.
set -euo pipefail
out=${RESULTS:-loadtest/results/planner-validation-llamacpp}
steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=(profile 1p1d colocated plan)
if [[ -z ${BIN:-} ]]; then
  BIN=$(mktemp -d)
  go build -o "$BIN/" ./cmd/coordinator ./cmd/prefill-worker ./cmd/decode-worker ./cmd/mkgguf ./loadtest
fi
work=${WORK:-$(mktemp -d)}
model=$work/qwen2.5-0.5b-random-q8_0.gguf
if [[ " ${steps[*]} " =~ \ (profile|1p1d|colocated)\  ]]; then
  [[ -f $model ]] || "$BIN/mkgguf" --shape qwen2.5-0.5b --tied --type q8_0 --seed 1 --out "$model" >/dev/null
fi
N=${N:-100}

# Workload, SLO and worker limits, the same on both sides.
IN=256 OUT=32 TTFT=2000 TPOT=100
llama=(--engine llamacpp --model "$model" --ctx-size 4096 --max-seqs 17)
prefill_limits=(--max-batch-tokens 1024 --chunk-tokens 1024)
decode_limits=(--max-batch 16 --kv-blocks 256)
colocated_limits=(--max-batch 16 --kv-blocks 256 --chunk-tokens 512 --max-batch-tokens 512)
plan=(--slo-ttft ${TTFT}ms --slo-tpot ${TPOT}ms --max-prefill-tokens 1024 --max-decode-batch 16)

profile() {
  local busy
  rm -f "$work/stop"
  # The neighbour: profiles of CPU 1, one after another until stopped
  # (one profile runs its grid in about as long as profile-t1's).
  while [[ ! -f $work/stop ]]; do
    taskset -c 1 "$BIN/coordinator" profile "${llama[@]}" --engine-threads 1 --max-batch 16 --max-tokens 1024 \
      --budget 10m --out "$work/neighbour.json" >/dev/null 2>&1 || true
  done & busy=$!
  sleep 5 # the neighbour's model loaded and stepping
  taskset -c 0 "$BIN/coordinator" profile "${llama[@]}" --engine-threads 1 --max-batch 16 --max-tokens 1024 \
    --budget 90s --model-name qwen2.5-0.5b-random-q8_0 --out $out/profile-t1.json
  touch "$work/stop"; pkill -P $busy || true; wait $busy 2>/dev/null || true
  taskset -c 0,1 "$BIN/coordinator" profile "${llama[@]}" --engine-threads 2 --max-batch 16 --max-tokens 1024 \
    --budget 90s --model-name qwen2.5-0.5b-random-q8_0 --out $out/profile-t2.json
}

refit() {
  for t in t1 t2; do "$BIN/coordinator" profile --refit $out/profile-$t.json --out $out/profile-$t.json >/dev/null; done
}

# deploy MODE: a coordinator and pinned workers on loopback, NATS users
# generated per run; sets pids.
pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
trap stop EXIT
deploy() {
  local mode=$1 auth
  auth=$(mktemp -d)
  openssl rand -hex 16 >"$auth/prefill.pw"; openssl rand -hex 16 >"$auth/decode.pw"
  printf 'users:\n  - {user: prefill, password: %s, role: prefill}\n  - {user: decode, password: %s, role: %s}\n' \
    "$(cat "$auth/prefill.pw")" "$(cat "$auth/decode.pw")" "$([[ $mode == colocated ]] && echo colocated || echo decode)" >"$auth/users.yaml"
  "$BIN/coordinator" --http-addr 127.0.0.1:18090 --nats-listen 127.0.0.1:14232 --nats-auth-file "$auth/users.yaml" \
    --mode "$([[ $mode == colocated ]] && echo colocated || echo disaggregated)" --engine llamacpp --model "$model" --log-level warn 2>"$auth/coordinator.log" & pids+=($!)
  sleep 1
  local nats=(--nats-url nats://127.0.0.1:14232 --log-level warn)
  if [[ $mode == colocated ]]; then
    taskset -c 0,1 "$BIN/decode-worker" --role colocated --id colocated-0 "${nats[@]}" --nats-user decode --nats-password-file "$auth/decode.pw" \
      --grpc-addr 127.0.0.1:19310 --metrics-addr 127.0.0.1:19320 "${llama[@]}" --engine-threads 2 "${colocated_limits[@]}" 2>>"$auth/workers.log" & pids+=($!)
  else
    taskset -c 0 "$BIN/prefill-worker" --id prefill-0 "${nats[@]}" --nats-user prefill --nats-password-file "$auth/prefill.pw" \
      --grpc-addr 127.0.0.1:19300 --metrics-addr 127.0.0.1:19301 "${llama[@]}" --engine-threads 1 "${prefill_limits[@]}" 2>>"$auth/workers.log" & pids+=($!)
    taskset -c 1 "$BIN/decode-worker" --id decode-0 "${nats[@]}" --nats-user decode --nats-password-file "$auth/decode.pw" \
      --grpc-addr 127.0.0.1:19310 --metrics-addr 127.0.0.1:19311 "${llama[@]}" --engine-threads 1 "${decode_limits[@]}" 2>>"$auth/workers.log" & pids+=($!)
  fi
  for _ in $(seq 300); do curl -sf 127.0.0.1:18090/readyz >/dev/null && break; sleep 0.2; done
  sleep 1 # every worker's first heartbeat
}

# measure MODE RATE: one loadtest run (Poisson arrivals), then its
# predictions (predict). The deployment serves every rate of a mode, so
# each run takes a seed of its own (1, 2, ...): with the same seed a run
# would replay the prompts of the one before onto the workers' warm prefix
# caches. (The saved runs predate prefix caching: mean_prefix_hit_tokens 0.)
seed=0
measure() {
  local mode=$1 rate=$2 name="$1-${2}qps"
  seed=$((seed + 1))
  "$BIN/loadtest" run --base-url http://127.0.0.1:18090 --quiet --seed $seed \
    --dataset-name random --random-input-len $IN --random-output-len $OUT --random-range-ratio 0 \
    --prompt-format tokens --tokenizer approx --num-prompts "$N" --request-rate "$rate" \
    --goodput ttft:$TTFT tpot:$TPOT --save-result --save-detailed --result-dir $out --result-filename "measured-$name.json" >/dev/null
  predict "$mode" "$rate"
}

# predict MODE RATE: two predictions of the planner for the design of
# measured-MODE-RATEqps.json: predicted-* on the run's own arrivals and
# lengths (the result JSON as the workload, at the rate its arrivals had:
# like for like), and predicted-poisson-* on 2000 Poisson arrivals at RATE
# (the steady state a short run may not reach).
predict() {
  local mode=$1 rate=$2 name="$1-${2}qps"
  local design=(--design 1P+1D --profile $out/profile-t1.json)
  [[ $mode == colocated ]] && design=(--design 1C --max-batch-tokens 512 --profile $out/profile-t1.json --colocated-profile $out/profile-t2.json)
  local actual n
  read -r actual n < <(python3 -c 'import json,sys; t=sorted(json.load(open(sys.argv[1]))["start_times"]); print((len(t)-1)/(t[-1]-t[0]), len(t))' $out/measured-$name.json)
  "$BIN/coordinator" plan "${design[@]}" "${plan[@]}" --workload $out/measured-$name.json --rate "$actual" --requests "$n" --output json >$out/predicted-$name.json
  "$BIN/coordinator" plan "${design[@]}" "${plan[@]}" --workload fixed:$IN/$OUT --rate "$rate" --requests 2000 --output json >$out/predicted-poisson-$name.json
}

repredict() {
  local f name
  for f in $out/measured-*qps.json; do
    name=$(basename "$f" qps.json); name=${name#measured-}
    predict "${name%%-*}" "${name#*-}"
  done
}

for s in "${steps[@]}"; do
  case $s in
    profile) profile ;;
    1p1d) deploy 1p1d; for r in ${RATES_1P1D:-0.6 0.8 1.0 1.2 1.4}; do measure 1p1d "$r"; done; stop ;;
    colocated) deploy colocated; for r in ${RATES_COLOCATED:-0.6 0.8 1.0 1.2 1.4}; do measure colocated "$r"; done; stop ;;
    plan) "$BIN/coordinator" plan --profile $out/profile-t1.json --colocated-profile $out/profile-t2.json --gpu-budget 2 \
            "${plan[@]}" --max-batch-tokens 512 --workload fixed:$IN/$OUT --output json >$out/plan-budget2.json ;;
    refit) refit ;;
    repredict) repredict ;;
    *) echo "unknown step $s (want profile, 1p1d, colocated, plan, refit or repredict)" >&2; exit 2 ;;
  esac
done
