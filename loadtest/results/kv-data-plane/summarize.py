#!/usr/bin/env python3
"""Tables of the KV data-plane results (issue 14) from the JSON lines that
run.sh writes next to this file: netbench.jsonl, chaos.jsonl,
exposed-ref.jsonl, exposed-sim.jsonl. Prints Markdown."""
import json
import os

here = os.path.dirname(os.path.abspath(__file__))


def lines(name):
    path = os.path.join(here, name)
    if not os.path.exists(path):
        return []
    return [json.loads(l) for l in open(path) if l.startswith("{")]


nb = lines("netbench.jsonl")
if nb:
    print("### netbench: time to deliver 64 MiB of bf16 KV, median of 9 rounds\n")
    codecs = sorted({c for r in nb for c in r["fixed_ms"]})
    print("| link Gb/s | adaptive (codec, ms) | best fixed (codec, ms) | adaptive ÷ best | none ÷ adaptive | "
          + " | ".join(f"{c} ms" for c in codecs) + " | raw TCP ms | gRPC ÷ raw TCP |")
    print("|---:|---|---|---:|---:|" + "---:|" * len(codecs) + "---:|---:|")
    for r in nb:
        print(f"| {r['link_gbps']:g} | {r['adaptive_codec']}, {r['adaptive_ms']:.1f} | {r['best_fixed_codec']}, {r['best_fixed_ms']:.1f} | "
              f"{r['adaptive_over_best']:.3f} | {r['none_over_adaptive']:.3f} | "
              + " | ".join(f"{r['fixed_ms'][c]:.1f}" for c in codecs)
              + f" | {r['raw_tcp_ms']:.1f} | {r['grpc_over_tcp']:.3f} |")
    print("\n### netbench: codec none over k streams at once, and in chunks of n tokens (ms)\n")
    ks = sorted({k for r in nb for k in r.get("streams_ms", {})}, key=int)
    ns = sorted({k for r in nb for k in r.get("chunk_ms", {})}, key=int)
    print("| link Gb/s | " + " | ".join(f"{k} stream(s)" for k in ks) + " | best gRPC ÷ raw TCP | "
          + " | ".join(f"chunks of {n} ({nb[0]['chunk_frames'][n]} frames)" for n in ns) + " |")
    print("|---:|" + "---:|" * (len(ks) + 1 + len(ns)))
    for r in nb:
        print(f"| {r['link_gbps']:g} | " + " | ".join(f"{r['streams_ms'][k]:.1f}" for k in ks)
              + f" | {r['grpc_over_tcp_best']:.3f} | " + " | ".join(f"{r['chunk_ms'][n]:.1f}" for n in ns) + " |")

ch = lines("chaos.jsonl")
if ch:
    print("\n### chaos: one run per fault\n")
    print("| fault | rate req/s | completed | failed | 429 | retried | recovered (tokens sent) | outputs equal (compared) | "
          "leaked blocks | retained bytes | settle ms | goroutines before → after | admitted within SLO | p99 TTFT ms | peak RSS MiB (max process) |")
    print("|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---|---:|---:|---|")
    for r in ch:
        rss = r.get("peak_rss_mib", {})
        top = max(rss, key=rss.get) if rss else ""
        gor = f"{r['goroutines_before']} → {r['goroutines_after']}"
        if r.get("goroutines_after_repeat"):
            gor += f" → {r['goroutines_after_repeat']} (repeat)"
        print(f"| {r['fault']} | {r['request_rate']:.1f} | {r['completed']} | {r['failed']} | {r['rejected_429']} | {r['retried']} | "
              f"{r.get('recovered_tokens_sent') or '—'} | {r['outputs_equal']} ({r['compared']}) | {r['leaked_blocks']} | {r['retained_bytes']} | "
              f"{r['settle_ms']} | {gor} | {r['admitted_slo_attainment']:.1%} | {r['p99_ttft_ms']:.0f} | "
              f"{rss.get(top, 0):.0f} ({top}) |")

for eng in ("ref", "sim"):
    ex = lines(f"exposed-{eng}.jsonl")
    for r in ex:
        print(f"\nexposed KV transfer, {eng} engine, 10 Gb/s prefill links, {r['request_rate']:.1f} req/s, {r['completed']} requests: "
              f"mean {r['mean_kv_transfer_ms']:.2f} ms, p99 {r['p99_kv_transfer_ms']:.2f} ms after the prefill ended "
              f"(whole stream: mean {r['mean_kv_stream_ms']:.2f} ms)")
