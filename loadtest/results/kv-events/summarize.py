"""Prints README.md's table from the result JSONs, metric dumps and NATS counts here.

usage: python3 loadtest/results/kv-events/summarize.py [NAME...]
(no NAME: digest, events)
"""
import json, os, sys

d = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ beside the results
sys.path.insert(0, os.path.join(d, "..", "prefix-cache"))
import summarize as prefix_cache  # noqa: E402  its metrics() reads the same dumps

CEILING = 0.650  # infinite-cache hit ratio of the slice (loadtest/results/prefix-cache/README.md)


def row(name):
    r = json.load(open(os.path.join(d, name + ".json")))
    p = r.get("pdserve", {})
    n = p.get("requests_with_budget", 0)
    m = prefix_cache.metrics(name, d)
    nats = json.load(open(os.path.join(d, name + ".nats.json")))
    total = lambda k: round(p.get("mean_" + k, 0) * n)
    prompt, hit = total("prompt_tokens"), total("prefix_hit_tokens")
    chit = m.get("pdserve_prefix_hit_tokens_total", 0)
    pred = m.get("pdserve_prefix_hit_tokens_predicted_total", 0)
    secs = nats["seconds"]
    return dict(name=name, ok=r["completed"], failed=r["failed"], ratio=hit / max(prompt, 1), hit=hit,
                pred=pred / max(chit, 1), ttft=(r["p50_ttft_ms"], r["p95_ttft_ms"], r["p99_ttft_ms"]),
                goodput=r.get("request_goodput") or 0,
                hb=nats["heartbeats"]["bytes"] / secs / 1e3, kv=nats["kv_events"]["bytes"] / secs / 1e3,
                kvmsgs=nats["kv_events"]["msgs"] / secs, digest=nats["digest_hashes_max"])


names = sys.argv[1:] or ["digest", "events"]
print("| run | ok/failed | hit ratio (of ceiling 0.650) | hit tokens the router predicted | TTFT p50/p95/p99 ms | goodput req/s | heartbeats kB/s | KV events kB/s (msgs/s) | NATS total kB/s | largest digest, hashes |")
print("|---|---|---|---:|---|---:|---:|---:|---:|---:|")
for name in names:
    try:
        x = row(name)
    except FileNotFoundError:
        print(f"| {name} | not run |")
        continue
    print(f"| {x['name']} | {x['ok']}/{x['failed']} | {x['ratio']:.3f} ({x['ratio'] / CEILING:.2f}) | {x['pred']:.2%} | "
          f"{x['ttft'][0]:.0f} / {x['ttft'][1]:.0f} / {x['ttft'][2]:.0f} | {x['goodput']:.2f} | {x['hb']:.1f} | "
          f"{x['kv']:.1f} ({x['kvmsgs']:.1f}) | {x['hb'] + x['kv']:.1f} | {x['digest']} |")
