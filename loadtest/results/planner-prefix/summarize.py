"""Prints README.md's table: the planner's predictions (predicted-xS.json,
with caches; predicted-nocache-xS.json, without) against the measured runs
(measured-xS.json, the router on KV events; measured-digest-xS.json, on
heartbeat digests), per time scale S of the trace's gaps.

usage: python3 loadtest/results/planner-prefix/summarize.py [S...]
(no S: 1.6 1.3 1.0)
"""
import json, os, sys

d = os.path.dirname(os.path.abspath(__file__))
TTFT_MS = 5000  # the SLO of run.sh: TTFT <= 5 s, TPOT <= 100 ms


def measured(name):
    r = json.load(open(os.path.join(d, name)))
    p = r.get("pdserve", {})
    n = r["num_prompts"]
    ttft_ok = sum(1 for t, e in zip(r["ttfts"], r["errors"]) if not e and 0 < t * 1000 <= TTFT_MS)
    ratio = p.get("mean_prefix_hit_tokens", 0) / max(p.get("mean_prompt_tokens", 1), 1)
    return dict(rate=r["request_rate"], ttft_att=ttft_ok / n, att=r.get("slo_attainment") or 0, hit=ratio,
                ttft=(r["p50_ttft_ms"], r["p90_ttft_ms"], r["p99_ttft_ms"]), failed=r["failed"])


def predicted(name):
    e = json.load(open(os.path.join(d, name)))
    p = e["prediction"]
    c = p.get("prefix_cache") or {}
    return dict(rate=p["rate"], ttft_att=p["ttft_attainment"], att=p["attainment"], hit=c.get("hit_ratio", 0),
                ttft=(p["ttft_ms"]["p50"], p["ttft_ms"]["p90"], p["ttft_ms"]["p99"]))


scales = sys.argv[1:] or ["1.6", "1.3", "1.0"]
print("| trace gaps × | rate req/s | source | hit ratio | TTFT ≤ 5 s | both SLOs | TTFT p50 / p90 / p99 ms |")
print("|---:|---:|---|---:|---:|---:|---|")
for s in scales:
    rows = []
    for label, f in (("measured, router on KV events (default)", f"measured-x{s}.json"),
                     ("measured, router on heartbeat digests", f"measured-digest-x{s}.json")):
        try:
            rows.append((label, measured(f)))
        except FileNotFoundError:
            pass
    for label, f in (("planner, caches", f"predicted-x{s}.json"), ("planner, no cache", f"predicted-nocache-x{s}.json")):
        try:
            rows.append((label, predicted(f)))
        except FileNotFoundError:
            pass
    for label, x in rows:
        t = x["ttft"]
        print(f"| {s} | {x['rate']:.2f} | {label} | {x['hit']:.3f} | {x['ttft_att']:.1%} | {x['att']:.1%} | {t[0]:.0f} / {t[1]:.0f} / {t[2]:.0f} |")
