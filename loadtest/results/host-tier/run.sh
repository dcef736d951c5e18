#!/usr/bin/env bash
# One run of the kv-events slice (loadtest/results/kv-events/: Mooncake
# rows 3793-3992, replay x1.3 = 3.15 req/s, 4 prefill + 2 decode sim
# workers, h100/llama-3-8b with a 128k context, the default policy, every
# engine-memory prefix cache at its default size) with the workers' host
# tier at a given budget (worker flags, e.g. --host-cache-bytes 0).
#
# usage (from the repository root):
#   loadtest/results/host-tier/run.sh NAME [worker flags]
#   e.g. run.sh engine-only --host-cache-bytes 0
#        run.sh host-4x --host-cache-bytes 256000000000
#        DECODE_FLAGS=--host-cache-bytes=0 run.sh host-4x-prefill --host-cache-bytes 256000000000
# DECODE_FLAGS: more flags for the decode workers only, after the others
# (a repeated flag takes its last value), e.g. DECODE_FLAGS=--host-cache-bytes=0.
# PREFILL_FLAGS: the same for the prefill workers only, e.g.
# PREFILL_FLAGS="--pace-gbps=100 --peer-link-gbps=0".
# DECODES: the number of decode workers (default 2; the issue's measure
# uses 3). POLICY: a coordinator policy file (default: the default policy),
# e.g. POLICY=loadtest/results/prefix-cache/policy-leastloaded.yaml.
# BIN: directory with coordinator, prefill-worker, decode-worker and
# loadtest (default: built into a temporary directory). Results go here:
# NAME.json, NAME.md, NAME.metrics.txt. Ports 28080, 24222, 291xx, 292xx.
set -euo pipefail
name=$1; shift
wflags=("$@")
out=loadtest/results/host-tier
if [[ -z ${BIN:-} ]]; then
  BIN=$(mktemp -d); go build -o "$BIN/" ./cmd/coordinator ./cmd/prefill-worker ./cmd/decode-worker ./loadtest
fi
sim=(--engine sim --profile loadtest/results/prefix-cache/h100-llama-3-8b-128k-tp1.json)
tr=(--dataset-name mooncake --dataset-path data/mooncake-fast25/synthetic_trace.jsonl
    --mooncake-block-size 512 --trace-replay --trace-skip 3793 --num-prompts 200 --trace-time-scale 1.3)
auth=$(mktemp -d)
for u in prefill decode; do openssl rand -hex 16 >"$auth/$u.pw"; done
printf 'users:\n  - {user: prefill, password: %s, role: prefill}\n  - {user: decode, password: %s, role: decode}\n' \
  "$(cat "$auth/prefill.pw")" "$(cat "$auth/decode.pw")" >"$auth/users.yaml"
if [[ -n ${POLICY:-} ]]; then cp "$POLICY" "$auth/policy.yaml"; else echo "# the default policy" >"$auth/policy.yaml"; fi
decodes=$(seq 0 $((${DECODES:-2} - 1)))
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait' EXIT
"$BIN/coordinator" --http-addr 127.0.0.1:28080 --nats-listen 127.0.0.1:24222 --policy "$auth/policy.yaml" --nats-auth-file "$auth/users.yaml" \
  --log-level warn --engine sim 2>"$auth/coordinator.log" & pids+=($!)
sleep 1
for i in 0 1 2 3; do
  "$BIN/prefill-worker" --id prefill-$i --nats-url nats://127.0.0.1:24222 --nats-user prefill --nats-password-file "$auth/prefill.pw" --grpc-addr 127.0.0.1:2910$i \
    --metrics-addr 127.0.0.1:2920$i "${sim[@]}" --prefix-cache-tokens -1 --log-level warn "${wflags[@]}" ${PREFILL_FLAGS:-} 2>>"$auth/workers.log" & pids+=($!)
done
for i in $decodes; do
  "$BIN/decode-worker" --id decode-$i --nats-url nats://127.0.0.1:24222 --nats-user decode --nats-password-file "$auth/decode.pw" --grpc-addr 127.0.0.1:2911$i \
    --metrics-addr 127.0.0.1:2921$i "${sim[@]}" --kv-blocks 30000 --prefix-cache-tokens -1 --log-level warn "${wflags[@]}" ${DECODE_FLAGS:-} 2>>"$auth/workers.log" & pids+=($!)
done
for _ in $(seq 100); do curl -sf 127.0.0.1:28080/readyz >/dev/null && break; sleep 0.2; done
sleep 1 # every worker's first heartbeat
"$BIN/loadtest" run --base-url http://127.0.0.1:28080 --quiet --seed 1 --goodput ttft:5000 tpot:100 \
  --save-result --result-dir "$out" --result-filename "$name.json" "${tr[@]}" --no-plots | tee "$out/$name.md"
{ for p in 29200 29201 29202 29203 $(for i in $decodes; do echo 2921$i; done); do curl -s 127.0.0.1:$p/metrics | grep -E '^pdserve_(prefill_prefix_cache|decode_prefix_cache|decode_kv_bytes_saved|prefill_step)' | sed "s/^/$p /"; done
  curl -s 127.0.0.1:28080/metrics | grep -E '^pdserve_(prefix|router_decisions)' | sed 's/^/coord /'; } > "$out/$name.metrics.txt" || true
