"""Prints README.md's table from the result JSONs and metric dumps here.

usage: python3 loadtest/results/host-tier/summarize.py [NAME...]
(no NAME: engine-only, host-4x)
       python3 loadtest/results/host-tier/summarize.py --measure NAME...
(issue 27's measure table: the first NAME is the base of "prefill GPU-s
saved", and peer pulls are counted)
"""
import json, os, sys

d = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ beside the results
sys.path.insert(0, os.path.join(d, "..", "prefix-cache"))
import summarize as prefix_cache  # noqa: E402  its metrics() reads the same dumps

CEILING = 0.650  # infinite-cache hit ratio of the slice (loadtest/results/prefix-cache/README.md)
HOST = '{tier="host"}'


def row(name):
    r = json.load(open(os.path.join(d, name + ".json")))
    p = r.get("pdserve", {})
    n = p.get("requests_with_budget", 0)
    m = prefix_cache.metrics(name, d)
    total = lambda k: round(p.get("mean_" + k, 0) * n)
    prompt, hit = total("prompt_tokens"), total("prefix_hit_tokens")
    tier = lambda k: sum(m.get(f"pdserve_{role}_prefix_cache_tier_{k}{HOST}", 0) for role in ("prefill", "decode"))
    engine_hit = m.get("pdserve_prefill_prefix_cache_hit_tokens_total", 0)
    return dict(name=name, ok=r["completed"], failed=r["failed"], ratio=hit / max(prompt, 1),
                computed=prompt - hit, hit=hit, engine_hit=engine_hit,
                host_hit=m.get(f"pdserve_prefill_prefix_cache_tier_hit_tokens_total{HOST}", 0),
                host_load=tier("load_seconds_total"), host_gib=tier("bytes") / 2**30,
                spills=tier("spills_total"), evict=tier("evictions_total"),
                ttft=(r["p50_ttft_ms"], r["p95_ttft_ms"], r["p99_ttft_ms"]), tpot99=r["p99_tpot_ms"],
                queue=(p.get("p50_queue_ms", 0), p.get("mean_queue_ms", 0)),
                goodput=r.get("request_goodput") or 0, att=r.get("slo_attainment") or 0,
                prefill_s=m.get("pdserve_prefill_step_seconds_sum", 0),
                pulls=sum(m.get(f"pdserve_{role}_prefix_cache_peer_pulls_total", 0) for role in ("prefill", "decode")),
                pull_tokens=sum(m.get(f"pdserve_{role}_prefix_cache_peer_hit_tokens_total", 0) for role in ("prefill", "decode")),
                pull_skipped=sum(m.get(f"pdserve_{role}_prefix_cache_peer_pulls_skipped_total", 0) for role in ("prefill", "decode")),
                pull_failed=sum(m.get(f"pdserve_{role}_prefix_cache_peer_pull_failures_total", 0) for role in ("prefill", "decode")),
                pull_s=sum(m.get(f"pdserve_{role}_prefix_cache_peer_pull_seconds_total", 0) for role in ("prefill", "decode")))


def measure(names):
    """Issue 27's measure table; the first name is the base of the GPU-s saved."""
    rows = [row(n) for n in names]
    base = rows[0]["prefill_s"]
    print("| run | ok/failed | hit ratio (of ceiling 0.650) | TTFT p50/p95/p99 ms | TPOT p99 ms | goodput req/s (attainment, TTFT 5 s, TPOT 100 ms) | prefill GPU-s (saved vs " + names[0] + ") | peer pulls (tokens; skipped, failed; pull s) |")
    print("|---|---|---|---|---:|---|---|---|")
    for x in rows:
        print(f"| {x['name']} | {x['ok']}/{x['failed']} | {x['ratio']:.3f} ({x['ratio'] / CEILING:.2f}) | "
              f"{x['ttft'][0]:.0f} / {x['ttft'][1]:.0f} / {x['ttft'][2]:.0f} | {x['tpot99']:.0f} | {x['goodput']:.2f} ({x['att']:.1%}) | "
              f"{x['prefill_s']:.1f} ({base - x['prefill_s']:+.1f}, {(base - x['prefill_s']) / max(base, 1e-9):.0%}) | "
              f"{x['pulls']:.0f} ({x['pull_tokens']:,.0f}; {x['pull_skipped']:.0f}, {x['pull_failed']:.0f}; {x['pull_s']:.2f}) |")


if sys.argv[1:2] == ["--measure"]:
    measure(sys.argv[2:])
    sys.exit(0)


names = sys.argv[1:] or ["engine-only", "host-4x"]
print("| run | ok/failed | hit ratio (of ceiling 0.650) | prefill tokens computed | prefill hits engine / host tier | host load s (modeled) | host tier at the end GiB (spills, evictions) | TTFT p50/p95/p99 ms | queue p50/mean ms | TPOT p99 ms | goodput req/s (attainment) | prefill GPU-s (Σ step time) |")
print("|---|---|---|---:|---:|---:|---:|---|---|---:|---|---:|")
for name in names:
    try:
        x = row(name)
    except FileNotFoundError:
        print(f"| {name} | not run |")
        continue
    print(f"| {x['name']} | {x['ok']}/{x['failed']} | {x['ratio']:.3f} ({x['ratio'] / CEILING:.2f}) | {x['computed']:,} | "
          f"{x['engine_hit']:,.0f} / {x['host_hit']:,.0f} | {x['host_load']:.2f} | {x['host_gib']:.1f} ({x['spills']:.0f}, {x['evict']:.0f}) | "
          f"{x['ttft'][0]:.0f} / {x['ttft'][1]:.0f} / {x['ttft'][2]:.0f} | {x['queue'][0]:.0f} / {x['queue'][1]:.0f} | {x['tpot99']:.0f} | {x['goodput']:.2f} ({x['att']:.1%}) | {x['prefill_s']:.1f} |")
