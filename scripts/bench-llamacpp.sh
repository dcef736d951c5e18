#!/usr/bin/env bash
# Benchmarks the llamacpp engine on this machine (issue 10's figures):
#   1. pdserve colocated vs llama-server, same model, same threads, same
#      llama.cpp build, at three request rates;
#   2. three ways on the same cores at one rate: 1 prefill + 1 decode
#      worker, each pinned to its own core; colocated on both cores;
#      llama-server on both cores.
# Model: a random-weight GGUF of Qwen2.5-0.5B's shape (24 layers, hidden
# 896, 14 heads, 2 KV heads, FFN 4864, vocab 151936, tied embeddings, q8_0),
# written by mkgguf: every figure depends on random weights only through
# the model's shape (outputs are fixed-length, ignore_eos).
#
# Needs llama-server built from the pinned source outside the repository:
#   cmake -S third_party/llama/src -B DIR -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF
#   cmake --build DIR -j2 --target llama-server
# pdserve loads the libraries of that same build (--llama-lib), so both
# run the same llama.cpp code. Weight repacking is off on both
# (--no-repack): on this machine the natively built CPU backend's repacked
# q8_0 kernels (AMX) crash on prompts of more than one token.
#
# Usage: LLAMA_BUILD=DIR bash scripts/bench-llamacpp.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${LLAMA_BUILD:?set LLAMA_BUILD to a llama.cpp build directory (with bin/llama-server)}
out=${1:-loadtest/results/llamacpp}
lib=$build/bin
tmp=${TMPDIR:-/tmp}/pdserve-bench
mkdir -p "$out" "$tmp"
model=$tmp/qwen2.5-0.5b-q8_0.gguf
rates=${RATES:-0.25 0.5 1}
three_rate=${THREE_RATE:-0.25}
n=${NUM_PROMPTS:-40}
in=${INPUT_LEN:-256}
outlen=${OUTPUT_LEN:-32}
slo=${SLO:-"ttft:2500 tpot:150"}
ctx=8192
seqs=16
# Every run sends the same prompts (seed 1): llama-server's prompt cache
# would serve later runs from earlier ones, and pdserve has no prefix cache
# yet, so it is off.
nocache=(--extra-body '{"cache_prompt": false}')

make llama >/dev/null
[ -f "$model" ] || go run ./cmd/mkgguf --shape qwen2.5-0.5b --type q8_0 --tied --seed 1 --out "$model"
go build -o $tmp/ ./cmd/coordinator ./cmd/prefill-worker ./cmd/decode-worker ./loadtest

pids=()
stop() { for p in "${pids[@]:-}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
trap stop EXIT
wait_ready() { # URL PATH
  for _ in $(seq 1 120); do curl -sf "$1$2" >/dev/null && return 0; sleep 0.5; done
  echo "bench: $1 did not get ready" >&2; exit 1
}
run() { # LABEL URL RATE [LOADTEST FLAGS]
  local label=$1 url=$2 rate=$3; shift 3
  $tmp/loadtest run --base-url "$url" --num-prompts "$n" --random-input-len "$in" --random-output-len "$outlen" \
    --prompt-format tokens --tokenizer approx --request-rate "$rate" --seed 1 --goodput $slo "$@" \
    --quiet --no-plots --save-result --result-dir "$out" --label "$label" --result-filename "$label-rate$rate.json" >"$out/$label-rate$rate.md"
  echo "bench: $label at $rate req/s done"
}
pdserve_colocated() { # CPUS THREADS
  taskset -c "$1" $tmp/coordinator --standalone --mode colocated --http-addr 127.0.0.1:18080 --nats-listen 127.0.0.1:-1 \
    --engine llamacpp --model "$model" --llama-lib "$lib" --no-repack \
    --ctx-size $ctx --max-seqs $seqs --engine-threads "$2" >"$tmp/pdserve.log" 2>&1 &
  pids+=($!); wait_ready http://127.0.0.1:18080 /readyz
}
llama_server() { # CPUS THREADS
  taskset -c "$1" "$lib/llama-server" -m "$model" --host 127.0.0.1 --port 18081 -t "$2" -tb "$2" -c $ctx -np $seqs \
    --kv-unified -fa on --no-repack --no-webui >"$tmp/llama-server.log" 2>&1 &
  pids+=($!); wait_ready http://127.0.0.1:18081 /health
}

# 1. pdserve colocated vs llama-server, both cores, three rates.
pdserve_colocated 0,1 2
for r in $rates; do run pdserve-colocated http://127.0.0.1:18080 "$r"; done
stop
llama_server 0,1 2
for r in $rates; do run llama-server http://127.0.0.1:18081 "$r" "${nocache[@]}"; done
stop

# 2. Three ways at one rate. Disaggregated: one worker per core, one
# thread each; the coordinator and NATS float.
$tmp/coordinator --http-addr 127.0.0.1:18082 --nats-listen 127.0.0.1:14222 \
  --engine llamacpp --model "$model" --llama-lib "$lib" >"$tmp/coord.log" 2>&1 &
pids+=($!)
sleep 1
common=(--nats-url nats://127.0.0.1:14222 --engine llamacpp --model "$model" --llama-lib "$lib" --no-repack --ctx-size $ctx --max-seqs $seqs --engine-threads 1)
taskset -c 0 $tmp/prefill-worker "${common[@]}" --grpc-addr 127.0.0.1:19001 --metrics-addr 127.0.0.1:19101 >"$tmp/prefill.log" 2>&1 &
pids+=($!)
taskset -c 1 $tmp/decode-worker "${common[@]}" --grpc-addr 127.0.0.1:19002 --metrics-addr 127.0.0.1:19102 >"$tmp/decode.log" 2>&1 &
pids+=($!)
wait_ready http://127.0.0.1:18082 /readyz
run pdserve-1p1d-pinned http://127.0.0.1:18082 "$three_rate"
stop
[ -f "$out/pdserve-colocated-rate$three_rate.json" ] || { pdserve_colocated 0,1 2; run pdserve-colocated http://127.0.0.1:18080 "$three_rate"; stop; }
[ -f "$out/llama-server-rate$three_rate.json" ] || { llama_server 0,1 2; run llama-server http://127.0.0.1:18081 "$three_rate" "${nocache[@]}"; stop; }
echo "bench: results in $out"
