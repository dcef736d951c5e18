#!/usr/bin/env bash
# Issue 27's measure: the kv-events slice (Mooncake rows 3793-3992, x1.3,
# 3.15 req/s) on 4 prefill + 3 decode sim workers (h100/llama-3-8b, 128k
# context), every worker's KV transfers paced at 100 Gb/s (pushes and
# peer pulls cost the true KV size over the link), one run.sh per row:
#   defaults  today's defaults when the issue was filed: no prefix cache
#             (--prefix-cache-tokens 0), least-loaded routing, no host tier
#   engine    prefix-aware routing (the default policy), engine-memory
#             caches at their default size, no host tier, no peer pulls
#   host      + a host tier of 256 GB (about 4x a worker's engine memory)
#             on the prefill workers (decode workers keep their default, none)
#   peer      + peer pulls (--peer-link-gbps 100, the default) and the
#             router's credit for them (the other rows: --peer-link-gbps 0)
# usage (from the repository root): loadtest/results/host-tier/measure.sh [ROUND]
# ROUND (default 1) suffixes the run names (m-defaults-r1, ...); BIN as in
# run.sh (built once here when unset). Then:
#   python3 loadtest/results/host-tier/summarize.py --measure m-defaults-r1 m-engine-r1 m-host-r1 m-peer-r1
set -euo pipefail
round=${1:-1}
here=loadtest/results/host-tier
if [[ -z ${BIN:-} ]]; then
  BIN=$(mktemp -d); go build -o "$BIN/" ./cmd/coordinator ./cmd/prefill-worker ./cmd/decode-worker ./loadtest
fi
export BIN DECODES=3
host=256000000000
off="--pace-gbps=100 --peer-link-gbps=0"
POLICY=loadtest/results/prefix-cache/policy-leastloaded.yaml PREFILL_FLAGS="$off" DECODE_FLAGS="$off" \
  "$here/run.sh" "m-defaults-r$round" --prefix-cache-tokens 0 --host-cache-bytes 0
PREFILL_FLAGS="$off" DECODE_FLAGS="$off" "$here/run.sh" "m-engine-r$round" --host-cache-bytes 0
PREFILL_FLAGS="$off" DECODE_FLAGS="$off --host-cache-bytes=0" "$here/run.sh" "m-host-r$round" --host-cache-bytes $host
PREFILL_FLAGS="--pace-gbps=100" DECODE_FLAGS="--pace-gbps=100 --host-cache-bytes=0" "$here/run.sh" "m-peer-r$round" --host-cache-bytes $host
