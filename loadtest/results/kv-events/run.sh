#!/usr/bin/env bash
# One run of the router-weights slice (loadtest/results/router-weights/:
# Mooncake rows 3793-3992, replay x1.3 = 3.15 req/s, 4 prefill + 2 decode
# sim workers, h100/llama-3-8b with a 128k context, the default policy,
# every prefix cache at its default size) with the workers' prefix caches
# told to the router by heartbeat digests or by KV events, the NATS
# traffic of heartbeats and KV events counted meanwhile (natsbytes).
#
# usage (from the repository root):
#   loadtest/results/kv-events/run.sh NAME [worker flags]
#   e.g. run.sh digest --kv-events=false; run.sh events
# BIN: directory with coordinator, prefill-worker, decode-worker, loadtest
# and natsbytes (default: built into a temporary directory). Results go
# here: NAME.json, NAME.md, NAME.metrics.txt, NAME.nats.json.
set -euo pipefail
name=$1; shift
wflags=("$@")
out=loadtest/results/kv-events
if [[ -z ${BIN:-} ]]; then
  BIN=$(mktemp -d); go build -o "$BIN/" ./cmd/coordinator ./cmd/prefill-worker ./cmd/decode-worker ./loadtest ./loadtest/results/kv-events/natsbytes
fi
sim=(--engine sim --profile loadtest/results/prefix-cache/h100-llama-3-8b-128k-tp1.json)
tr=(--dataset-name mooncake --dataset-path data/mooncake-fast25/synthetic_trace.jsonl
    --mooncake-block-size 512 --trace-replay --trace-skip 3793 --num-prompts 200 --trace-time-scale 1.3)
auth=$(mktemp -d)
for u in prefill decode meter; do openssl rand -hex 16 >"$auth/$u.pw"; done
printf 'users:\n  - {user: prefill, password: %s, role: prefill}\n  - {user: decode, password: %s, role: decode}\n  - {user: meter, password: %s, role: coordinator}\n' \
  "$(cat "$auth/prefill.pw")" "$(cat "$auth/decode.pw")" "$(cat "$auth/meter.pw")" >"$auth/users.yaml"
echo "# the default policy" >"$auth/policy.yaml"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait' EXIT
"$BIN/coordinator" --http-addr 127.0.0.1:18080 --nats-listen 127.0.0.1:14222 --policy "$auth/policy.yaml" --nats-auth-file "$auth/users.yaml" \
  --log-level warn --engine sim 2>"$auth/coordinator.log" & pids+=($!)
sleep 1
for i in 0 1 2 3; do
  "$BIN/prefill-worker" --id prefill-$i --nats-url nats://127.0.0.1:14222 --nats-user prefill --nats-password-file "$auth/prefill.pw" --grpc-addr 127.0.0.1:1910$i \
    --metrics-addr 127.0.0.1:1920$i "${sim[@]}" --prefix-cache-tokens -1 --log-level warn "${wflags[@]}" 2>>"$auth/workers.log" & pids+=($!)
done
for i in 0 1; do
  "$BIN/decode-worker" --id decode-$i --nats-url nats://127.0.0.1:14222 --nats-user decode --nats-password-file "$auth/decode.pw" --grpc-addr 127.0.0.1:1911$i \
    --metrics-addr 127.0.0.1:1921$i "${sim[@]}" --kv-blocks 30000 --prefix-cache-tokens -1 --log-level warn "${wflags[@]}" 2>>"$auth/workers.log" & pids+=($!)
done
for _ in $(seq 100); do curl -sf 127.0.0.1:18080/readyz >/dev/null && break; sleep 0.2; done
sleep 1 # every worker's first heartbeat
"$BIN/natsbytes" --url nats://127.0.0.1:14222 --user meter --password-file "$auth/meter.pw" --out "$out/$name.nats.json" & meter=$!
"$BIN/loadtest" run --base-url http://127.0.0.1:18080 --quiet --seed 1 --goodput ttft:5000 tpot:100 \
  --save-result --result-dir "$out" --result-filename "$name.json" "${tr[@]}" --no-plots | tee "$out/$name.md"
kill -TERM "$meter"; wait "$meter"
{ for p in 19200 19201 19202 19203 19210 19211; do curl -s 127.0.0.1:$p/metrics | grep -E '^pdserve_(prefill_prefix_cache|decode_prefix_cache|decode_kv_bytes_saved|prefix)' | sed "s/^/$p /"; done
  curl -s 127.0.0.1:18080/metrics | grep -E '^pdserve_(prefix|router_decisions)' | sed 's/^/coord /'; } > "$out/$name.metrics.txt" || true
