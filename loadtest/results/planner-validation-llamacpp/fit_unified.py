"""The alternative step-time form tried against the DistServe fit of a
profile's measured points: one form for every step,

    step ms = a + b·T + c·T·K + d·S

(T tokens in the step, K KV cells the step's sequences hold after it, S
sequences), fitted by least squares on relative error as FitDistServe
does (without its non-negativity). Prints both forms' total error
(Σ|model − measured| / Σ measured) over the same points.

usage: python3 loadtest/results/planner-validation-llamacpp/fit_unified.py profile-t2.json
"""
import json, os, sys

path = sys.argv[1] if len(sys.argv) > 1 else "profile-t2.json"
if not os.path.exists(path):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), path)
d = json.load(open(path))
pts = [p for p in d["points"] if p.get("metric") == "step_ms"]


def features(p):
    pre = p.get("prefill") or []
    ctx = p.get("prefill_context") or [0] * len(pre)
    b, n = p.get("decode_batch", 0), p.get("decode_context", 0)
    t = sum(pre) + b
    k = sum(c + l for c, l in zip(ctx, pre)) + b * n
    return [1, t, t * k, len(pre) + b]


def solve(a, y):
    n = len(a)
    m = [row[:] + [y[i]] for i, row in enumerate(a)]
    for i in range(n):
        piv = max(range(i, n), key=lambda r: abs(m[r][i]))
        m[i], m[piv] = m[piv], m[i]
        for r in range(n):
            if r != i:
                f = m[r][i] / m[i][i]
                for c in range(i, n + 1):
                    m[r][c] -= f * m[i][c]
    return [m[i][n] / m[i][i] for i in range(n)]


x = [features(p) for p in pts]
y = [p["value"] for p in pts]
k = len(x[0])
ata = [[sum(x[r][i] * x[r][j] / y[r] ** 2 for r in range(len(y))) for j in range(k)] for i in range(k)]
atb = [sum(x[r][i] / y[r] for r in range(len(y))) for i in range(k)]
coef = solve(ata, atb)
pred = [sum(a * c for a, c in zip(row, coef)) for row in x]
total = sum(abs(p - m) for p, m in zip(pred, y)) / sum(y)
print(f"{os.path.basename(path)}: {len(pts)} points")
print(f"  unified form a + b·T + c·T·K + d·S: coefficients {[f'{c:.3g}' for c in coef]}, total error {total:.1%}")
print(f"  DistServe form (the profile's fit):  total error {d['measured']['fit']['total_rel_err']:.1%}")
