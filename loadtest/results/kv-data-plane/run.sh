#!/usr/bin/env bash
# The KV data plane on shaped links and faults survived by separate
# processes (issue 14): netbench per link speed, chaos per fault, and the
# exposed KV transfer per request on a 10 Gb/s link for the ref and sim
# engines. Needs root (network namespaces, tc); run it on an otherwise idle
# machine, from the repository root:
#   loadtest/results/kv-data-plane/run.sh [netbench|chaos|exposed]...
# (no argument: all three). Each writes its JSON lines here.
set -euo pipefail
out=loadtest/results/kv-data-plane
steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=(netbench chaos exposed)
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/" ./cmd/coordinator ./cmd/prefill-worker ./cmd/decode-worker ./loadtest ./cmd/chaos ./cmd/netbench
for s in "${steps[@]}"; do
  case $s in
    netbench) "$bin/netbench" --gbps 1,10,25 --kv-mib 64 --reps 9 --streams 1,2,4 --chunks 16,128,1024 | tee $out/netbench.jsonl ;;
    chaos) "$bin/chaos" --bin "$bin" --duration 15s | tee $out/chaos.jsonl ;;
    exposed)
      "$bin/chaos" --bin "$bin" --faults "" --link-gbps 10 --duration 15s | tee $out/exposed-ref.jsonl
      "$bin/chaos" --bin "$bin" --faults "" --link-gbps 10 --duration 15s \
        --engine-flags "--engine sim --profile h100/llama-3-8b/tp1 --payload-scale 1" | tee $out/exposed-sim.jsonl ;;
    *) echo "unknown step $s (want netbench, chaos or exposed)" >&2; exit 2 ;;
  esac
done
