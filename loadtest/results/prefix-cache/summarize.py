"""Prints README.md's tables from the result JSONs and metric dumps here.

usage: python3 loadtest/results/prefix-cache/summarize.py [NAME...]
"""
import json, os, sys
d = os.path.dirname(os.path.abspath(__file__))


def metrics(name, where=d):
    """Sums each metric over the workers (and coordinator) of NAME.metrics.txt in where."""
    m = {}
    try:
        for line in open(os.path.join(where, name + ".metrics.txt")):
            _, key, val = line.split()[:3]
            m[key] = m.get(key, 0) + float(val)
    except FileNotFoundError:
        pass
    return m


def row(name):
    r = json.load(open(os.path.join(d, name + ".json")))
    p = r.get("pdserve", {})
    n = p.get("requests_with_budget", 0)
    m = metrics(name)
    total = lambda k: round(p.get("mean_" + k, 0) * n)  # means are over every request with a budget
    return dict(
        name=name, ok=r["completed"], failed=r["failed"], n=n,
        prompt=total("prompt_tokens"), hit=total("prefix_hit_tokens"),
        dhit=total("decode_prefix_hit_tokens"),
        pf_hit=round(m.get("pdserve_prefill_prefix_cache_hit_tokens_total", 0)),
        dc_hit=round(m.get("pdserve_decode_prefix_cache_hit_tokens_total", 0)),
        reclaims=round(m.get("pdserve_decode_prefix_cache_reclaims_total", 0)),
        ttft=(r["p50_ttft_ms"], r["p95_ttft_ms"], r["p99_ttft_ms"]),
        split=tuple(p.get(f"mean_{t}_ms", 0) for t in ("queue", "prefill", "kv_transfer", "decode")),
        goodput=r.get("request_goodput") or 0, att=r.get("slo_attainment") or 0,
        wire=p.get("kv_bytes_wire", 0), saved=m.get("pdserve_decode_kv_bytes_saved_total", 0),
        placements={k.split('placement="')[1].split('"')[0]: v for k, v in m.items()
                    if k.startswith("pdserve_router_decisions_total") and 'placement="' in k},
    )


def main():
    names = sys.argv[1:] or ["prefix", "leastloaded", "roundrobin", "prefix-nodpc", "conditional"]
    print("| run | ok/failed | prompt tokens | prefix-hit tokens | prefill tokens computed | hit ratio | TTFT p50/p95/p99 ms | mean queue / prefill / kv_transfer / decode ms | goodput req/s (attainment) | KV on the wire per request, MiB (scaled) | decode-side hit tokens | decode KV not sent, GiB (true size) | decode reclaims | budget hits = worker counters |")
    print("|---|---|---:|---:|---:|---:|---|---|---|---:|---:|---:|---:|---|")
    for name in names:
        try:
            x = row(name)
        except FileNotFoundError:
            print(f"| {name} | not run |"); continue
        # The budget's prefix_hit_tokens come from the prefill worker, or from
        # the decode worker's cache for a local prefill; decode_prefix_hit_tokens
        # from the decode worker's Reserve. Both workers count every hit.
        budget, workers = x['hit'] + x['dhit'], x['pf_hit'] + x['dc_hit']
        check = f"yes ({budget:,})" if budget == workers else f"no: {budget:,} vs {workers:,}"
        print(f"| {name} | {x['ok']}/{x['failed']} | {x['prompt']:,} | {x['hit']:,} | {x['prompt'] - x['hit']:,} | "
              f"{x['hit'] / max(x['prompt'], 1):.3f} | {x['ttft'][0]:.0f} / {x['ttft'][1]:.0f} / {x['ttft'][2]:.0f} | "
              f"{' / '.join(f'{v:.0f}' for v in x['split'])} | {x['goodput']:.2f} ({x['att']:.1%}) | "
              f"{x['wire'] / max(x['n'], 1) / 2**20:.1f} | {x['dhit']:,} | {x['saved'] / 2**30:.1f} | {x['reclaims']} | {check} |")
    print()
    for name in names:
        try:
            print(f"{name}: placements {row(name)['placements']}")
        except FileNotFoundError:
            pass


if __name__ == "__main__":
    main()
