"""Prints README.md's tables from the result JSONs and metric dumps here."""
import json, os, sys
d = os.path.dirname(os.path.abspath(__file__))

def metrics(name):
    m = {}
    try:
        for line in open(os.path.join(d, name + ".metrics.txt")):
            src, key, val = line.split()[:3]
            m[key] = m.get(key, 0) + float(val)
    except FileNotFoundError:
        pass
    return m

def row(name):
    r = json.load(open(os.path.join(d, name + ".json")))
    p = r.get("pdserve", {})
    n = p.get("requests", r["completed"])
    m = metrics(name)
    inp = round(p.get("mean_prompt_tokens", 0) * p.get("requests_with_budget", 0))  # completed requests' prompts
    return dict(name=name, ok=r["completed"], failed=r["failed"], inp=inp,
                hit_budget=round(p.get("mean_prefix_hit_tokens", 0) * p.get("requests_with_budget", 0)),
                dhit_budget=round(p.get("mean_decode_prefix_hit_tokens", 0) * p.get("requests_with_budget", 0)),
                pf_hit=m.get("pdserve_prefill_prefix_cache_hit_tokens_total", 0),
                ttft=(r["p50_ttft_ms"], r["p95_ttft_ms"], r["p99_ttft_ms"]),
                goodput=r.get("request_goodput"), att=r.get("slo_attainment"),
                wire=p.get("kv_bytes_wire", 0), saved=m.get("pdserve_decode_kv_bytes_saved_total", 0),
                local=m, dur=r["duration"])

names = sys.argv[1:] or ["prefix", "leastloaded", "roundrobin", "prefix-nodpc", "conditional"]
print("| run | ok/failed | prompt tokens | prefix-hit tokens (budget) | prefill tokens computed | hit ratio | TTFT p50/p95/p99 ms | goodput req/s (attainment) | KV on wire MiB | decode KV bytes saved (true size) GiB |")
print("|---|---|---:|---:|---:|---:|---|---|---:|---:|")
for n in names:
    try:
        x = row(n)
    except FileNotFoundError:
        print(f"| {n} | not run | | | | | | | | |"); continue
    print(f"| {n} | {x['ok']}/{x['failed']} | {x['inp']} | {x['hit_budget']} | {x['inp']-x['hit_budget']} | {x['hit_budget']/x['inp']:.3f} | "
          f"{x['ttft'][0]:.0f} / {x['ttft'][1]:.0f} / {x['ttft'][2]:.0f} | {x['goodput'] or 0:.2f} ({x['att'] or 0:.1%}) | "
          f"{x['wire']/2**20:.0f} | {x['saved']/2**30:.1f} |")
