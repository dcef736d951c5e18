"""Prints README.md's table from the result JSONs and metric dumps here.

usage: python3 loadtest/results/router-weights/summarize.py [NAME...]
(no NAME: every NAME.json here, in sweep order)
"""
import glob, json, os, re, sys

d = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ beside the results
sys.path.insert(0, os.path.join(d, "..", "prefix-cache"))
import summarize as prefix_cache  # noqa: E402  its metrics() reads the same dumps


def metrics(name):
    """Sums each metric over the workers (and coordinator) of NAME.metrics.txt here."""
    return prefix_cache.metrics(name, d)


CEILING = 0.650  # infinite-cache hit ratio of the slice (loadtest/results/prefix-cache/README.md)


def weights(name):
    """The policy's prefix weights, "decode / prefill", from NAME.policy.yaml."""
    try:
        s = open(os.path.join(d, name + ".policy.yaml")).read()
    except FileNotFoundError:
        return "?"
    if "roundrobin" in s:
        return "round-robin"
    m = re.search(r"decode: \{prefix: ([\d.]+).*\n.*prefill: \{prefix: ([\d.]+)", s)
    return f"{m.group(1)} / {m.group(2)}" if m else "defaults"


def row(name):
    r = json.load(open(os.path.join(d, name + ".json")))
    p = r.get("pdserve", {})
    n = p.get("requests_with_budget", 0)
    m = metrics(name)
    total = lambda k: round(p.get("mean_" + k, 0) * n)
    prompt, hit, dhit = total("prompt_tokens"), total("prefix_hit_tokens"), total("decode_prefix_hit_tokens")
    workers = m.get("pdserve_prefill_prefix_cache_hit_tokens_total", 0) + m.get("pdserve_decode_prefix_cache_hit_tokens_total", 0)
    return dict(name=name, w=weights(name), ok=r["completed"], failed=r["failed"], prompt=prompt, hit=hit, dhit=dhit,
                ratio=hit / max(prompt, 1), ttft=(r["p50_ttft_ms"], r["p95_ttft_ms"], r["p99_ttft_ms"]),
                tpot99=r["p99_tpot_ms"], goodput=r.get("request_goodput") or 0, att=r.get("slo_attainment") or 0,
                wire=p.get("kv_bytes_wire", 0) / max(n, 1) / 2**20, check=(hit + dhit == round(workers)))


names = sys.argv[1:] or sorted((os.path.basename(f)[:-5] for f in glob.glob(os.path.join(d, "*.json"))),
                               key=lambda f: os.path.getmtime(os.path.join(d, f + ".json")))
print("| run | prefix weight decode / prefill | ok/failed | prefix-hit tokens | hit ratio | of ceiling 0.650 | TTFT p50/p95/p99 ms | TPOT p99 ms | goodput req/s (attainment) | decode-side hit tokens | KV on the wire per request, MiB (scaled) | budget hits = worker counters |")
print("|---|---|---|---:|---:|---:|---|---:|---|---:|---:|---|")
for name in names:
    try:
        x = row(name)
    except FileNotFoundError:
        print(f"| {name} | not run |")
        continue
    print(f"| {x['name']} | {x['w']} | {x['ok']}/{x['failed']} | {x['hit']:,} | {x['ratio']:.3f} | {x['ratio'] / CEILING:.2f} | "
          f"{x['ttft'][0]:.0f} / {x['ttft'][1]:.0f} / {x['ttft'][2]:.0f} | {x['tpot99']:.0f} | {x['goodput']:.2f} ({x['att']:.1%}) | "
          f"{x['dhit']:,} | {x['wire']:.1f} | {'yes' if x['check'] else 'no'} |")
