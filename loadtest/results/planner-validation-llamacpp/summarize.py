"""Prints README.md's tables: predicted vs measured SLO attainment and the
budget terms per rate, and each profile's fit error.

usage: python3 loadtest/results/planner-validation-llamacpp/summarize.py [DIR]
(DIR: the results, default this directory)
"""
import glob, json, math, os, re, sys
d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))


def rate(path):
    return float(re.search(r"-([0-9.]+)qps\.json$", path).group(1))


def measured(path):
    r = json.load(open(path))
    p = r["pdserve"]
    terms = {t: p.get(f"mean_{t}_ms", 0) for t in ("queue", "prefill", "kv_transfer")}
    return dict(att=r["slo_attainment"], ok=r["completed"], failed=r["failed"], ttft50=r["p50_ttft_ms"],
                ttft90=r["p90_ttft_ms"], tpot=r["mean_tpot_ms"], terms=terms)


def predicted(path):
    r = json.load(open(path))["prediction"]
    b = r["budget_s"]
    terms = {t: b.get(t, {}).get("mean", 0) * 1e3 for t in ("queue", "prefill", "kv_transfer")}
    return dict(att=r["attainment"], ttft50=r["ttft_ms"]["p50"], ttft90=r["ttft_ms"]["p90"], tpot=r["tpot_ms"]["mean"], terms=terms)


for design in ("1p1d", "colocated"):
    runs = sorted(glob.glob(os.path.join(d, f"measured-{design}-*qps.json")), key=rate)
    if not runs:
        continue
    print(f"\n### {design}\n")
    print("| rate req/s | attainment predicted (same arrivals) | measured (ok/failed) | error, points | predicted, 2000 Poisson arrivals | TTFT p50 pred / meas ms | TTFT p90 pred / meas ms | TPOT mean pred / meas ms | mean queue pred / meas | mean prefill pred / meas | mean kv_transfer pred / meas |")
    print("|---:|---:|---:|---:|---:|---|---|---|---|---|---|")
    worst = 0
    for m_path in runs:
        r = rate(m_path)
        m = measured(m_path)
        tail = os.path.basename(m_path).split(design + '-')[1]
        p = predicted(os.path.join(d, f"predicted-{design}-{tail}"))
        pp = predicted(os.path.join(d, f"predicted-poisson-{design}-{tail}"))
        err = (p["att"] - m["att"]) * 100
        worst = max(worst, abs(err))
        terms = " | ".join(f"{p['terms'][t]:.0f} / {m['terms'][t]:.0f}" for t in ("queue", "prefill", "kv_transfer"))
        print(f"| {r:g} | {p['att']:.1%} | {m['att']:.1%} ({m['ok']}/{m['failed']}) | {err:+.1f} | {pp['att']:.1%} | {p['ttft50']:.0f} / {m['ttft50']:.0f} | "
              f"{p['ttft90']:.0f} / {m['ttft90']:.0f} | {p['tpot']:.1f} / {m['tpot']:.1f} | {terms} |")
    print(f"\nlargest |error|: {worst:.1f} points")

def fmt(c):
    return "[" + ", ".join(f"{x:.4g}" for x in c) + "]"


def decode(ds):
    t = ds["large_batch_threshold"]
    if t <= 1:
        return fmt(ds["decode_large_batch_ms"])
    return f"{fmt(ds['decode_small_batch_ms'])} for B < {t}, {fmt(ds['decode_large_batch_ms'])} for B ≥ {t}"


for f in sorted(glob.glob(os.path.join(d, "profile-*.json"))):
    pr = json.load(open(f))
    ds = pr["distserve"]
    fit = pr["measured"]["fit"]
    print(f"\n{os.path.basename(f)}: {pr['name']}, {fit['points']} points, total {fit['total_rel_err']:.1%}, rms {fit['rms_rel_err']:.1%}, max {fit['max_rel_err']:.1%}; "
          f"prefill ms = {fmt(ds['prefill_ms'])} + cross {ds.get('prefill_cross_ms', 0):.3g}, decode ms = {decode(ds)}, "
          f"mixed ms = {fmt(ds.get('mixed_ms', [0, 0, 0]))}")
    mixed = [p for p in pr["points"] if p["name"].startswith("mixed")]
    if mixed:
        rms = (sum(p["rel_err"] ** 2 for p in mixed) / len(mixed)) ** 0.5
        print(f"  mixed points: {len(mixed)}, rms {rms:.1%}, worst {max(abs(p['rel_err']) for p in mixed):.1%}")
    worst = sorted(pr["points"], key=lambda p: -abs(p.get("rel_err", 0)))[:5]
    print("  worst points: " + ", ".join(f"{p['name']} {p['rel_err']:+.1%}" for p in worst))

# Drift: profiles taken again after the runs (DIR/after/), point by point
# against the ones the predictions used.
after = os.path.join(d, "after")
if os.path.isdir(after):
    print("\n### Machine speed drift: profiles after the runs ÷ before (geometric mean over shared points)\n")
    print("| profile | prefill | decode | mixed |")
    print("|---|---:|---:|---:|")
    for f in sorted(glob.glob(os.path.join(after, "profile-*.json"))):
        before = {p["name"]: p["value"] for p in json.load(open(os.path.join(d, os.path.basename(f))))["points"]}
        now = {p["name"]: p["value"] for p in json.load(open(f))["points"]}
        cells = []
        for kind in ("prefill", "decode", "mixed"):
            rs = [now[n] / before[n] for n in now if n in before and n.startswith(kind)]
            cells.append(f"{math.exp(sum(math.log(r) for r in rs) / len(rs)):.3f} ({len(rs)})" if rs else "—")
        print(f"| {os.path.basename(f)} | " + " | ".join(cells) + " |")
