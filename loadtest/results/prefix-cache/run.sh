#!/usr/bin/env bash
# One measured run: a coordinator and 4 prefill + 2 decode sim workers
# (h100/llama-3-8b/tp1) started as separate processes on loopback, the
# loadtest against them, then every worker's /metrics saved.
#
# usage (from the repository root):
#   loadtest/results/prefix-cache/run.sh NAME POLICY.yaml DECODE_PREFIX_TOKENS [extra coordinator flags] -- [loadtest run flags]
# BIN: directory with coordinator, prefill-worker, decode-worker, loadtest
# (default: built into a temporary directory). OUT: where the results go
# (default this directory). PREFILL_PREFIX_TOKENS: the prefill workers'
# --prefix-cache-tokens (default 500000; -1 = auto, the workers' default).
# DECODE_WORKERS: how many decode workers (default 2, at most 10).
# WORKER_FLAGS: more flags for every worker, split on spaces.
set -euo pipefail
name=$1 policy=$2 dpc=$3; shift 3
cflags=()
while [[ $# -gt 0 && $1 != -- ]]; do cflags+=("$1"); shift; done
shift || true
out=${OUT:-loadtest/results/prefix-cache}
ppc=${PREFILL_PREFIX_TOKENS:-500000}
if [[ -z ${BIN:-} ]]; then
  BIN=$(mktemp -d); go build -o "$BIN/" ./cmd/coordinator ./cmd/prefill-worker ./cmd/decode-worker ./loadtest
fi
sim=(--engine sim --profile "${PROFILE:-loadtest/results/prefix-cache/h100-llama-3-8b-128k-tp1.json}")
auth=$(mktemp -d)
openssl rand -hex 16 >"$auth/prefill.pw"; openssl rand -hex 16 >"$auth/decode.pw"
printf 'users:\n  - {user: prefill, password: %s, role: prefill}\n  - {user: decode, password: %s, role: decode}\n' \
  "$(cat "$auth/prefill.pw")" "$(cat "$auth/decode.pw")" >"$auth/users.yaml"
read -ra wflags <<<"${WORKER_FLAGS:-}"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait' EXIT
"$BIN/coordinator" --http-addr 127.0.0.1:18080 --nats-listen 127.0.0.1:14222 --policy "$policy" --nats-auth-file "$auth/users.yaml" \
  --log-level warn --engine sim "${cflags[@]}" 2>"$auth/coordinator.log" & pids+=($!)
sleep 1
for i in 0 1 2 3; do
  "$BIN/prefill-worker" --id prefill-$i --nats-url nats://127.0.0.1:14222 --nats-user prefill --nats-password-file "$auth/prefill.pw" --grpc-addr 127.0.0.1:1910$i \
    --metrics-addr 127.0.0.1:1920$i "${sim[@]}" --prefix-cache-tokens "$ppc" --log-level warn ${wflags[@]+"${wflags[@]}"} 2>>"$auth/workers.log" & pids+=($!)
done
ndec=${DECODE_WORKERS:-2}
for i in $(seq 0 $((ndec - 1))); do
  "$BIN/decode-worker" --id decode-$i --nats-url nats://127.0.0.1:14222 --nats-user decode --nats-password-file "$auth/decode.pw" --grpc-addr 127.0.0.1:1911$i \
    --metrics-addr 127.0.0.1:1921$i "${sim[@]}" --kv-blocks 30000 --prefix-cache-tokens "$dpc" --log-level warn ${wflags[@]+"${wflags[@]}"} 2>>"$auth/workers.log" & pids+=($!)
done
for _ in $(seq 100); do curl -sf 127.0.0.1:18080/readyz >/dev/null && break; sleep 0.2; done
sleep 1 # every worker's first heartbeat
"$BIN/loadtest" run --base-url http://127.0.0.1:18080 --quiet --seed 1 --goodput ttft:5000 tpot:100 \
  --save-result --result-dir "$out" --result-filename "$name.json" "$@" | tee "$out/$name.md"
{ for p in 19200 19201 19202 19203 $(seq 19210 $((19209 + ndec))); do curl -s 127.0.0.1:$p/metrics | grep -E '^pdserve_(prefill_prefix_cache|decode_prefix_cache|decode_kv_bytes_saved|prefix)' | sed "s/^/$p /"; done
  curl -s 127.0.0.1:18080/metrics | grep -E '^pdserve_(prefix|response_cache|router_decisions|kv_bytes)' | sed 's/^/coord /'; } > "$out/$name.metrics.txt" || true
