#!/usr/bin/env python3
"""Join retrieval accuracy (`origami eval retrieval --json`) with throughput (`origami bench --json`,
tagged by scripts/gpu_quality_throughput.sh) by (policy, budget share), and write one SVG chart
(accuracy against output tok/s, one line per policy through its budgets, full KV as a reference
point) and a markdown table.

    scripts/quality_vs_throughput.py --eval ctx.jsonl stream.jsonl --bench gpu.jsonl \\
        --svg docs/plots/quality_vs_throughput.svg --table docs/plots/quality_vs_throughput.md

Eval lines carry policy, budget, mode, accuracy and (for the share) max_document_tokens is not
used: the share is budget / --eval-context (default 2048, the dev documents' ~2065 tokens, so
256 / 512 / 1024 are 12.5 / 25 / 50%). Bench lines carry the tags "policy", "share" and "budget"
added by the GPU script. Points without a throughput (no bench line) appear in the table only.
"""
import argparse
import html
import json
import math
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]
MARKERS = {"context": "circle", "stream": "square"}


def load(paths):
    rows = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    rows.append(json.loads(line))
    return rows


def share_key(x):
    return round(float(x), 4)


def nice_ticks(lo, hi, n=5):
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while t <= hi + 1e-9 * step:
        ticks.append(t)
        t += step
    return ticks


def write_svg(path, series, references, title, modes):
    # series: {(policy, mode): [(tps, acc, label)]}; references: {mode: (tps, acc)}
    W, H, L, R, T, B = 820, 500, 70, 200, 40, 60
    xs = [p[0] for pts in series.values() for p in pts] + [r[0] for r in references.values()]
    ys = [p[1] for pts in series.values() for p in pts] + [r[1] for r in references.values()]
    if not xs:
        xs, ys = [0.0, 1.0], [0.0, 1.0]
    xt = nice_ticks(min(xs) * 0.95, max(xs) * 1.05)
    yt = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    x0, x1, y0, y1 = xt[0], xt[-1], 0.0, 1.0
    px = lambda x: L + (x - x0) / (x1 - x0 or 1) * (W - L - R)
    py = lambda y: H - B - (y - y0) / (y1 - y0) * (H - T - B)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2 - R / 2}" y="22" text-anchor="middle" font-size="14">{html.escape(title)}</text>']
    for t in xt:
        out.append(f'<line x1="{px(t):.1f}" y1="{T}" x2="{px(t):.1f}" y2="{H - B}" stroke="#eee"/>')
        out.append(f'<text x="{px(t):.1f}" y="{H - B + 16}" text-anchor="middle">{t:,.0f}</text>')
    for t in yt:
        out.append(f'<line x1="{L}" y1="{py(t):.1f}" x2="{W - R}" y2="{py(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{L - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{t:.1f}</text>')
    out.append(f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 18}" text-anchor="middle">output tok/s (GPU bench)</text>')
    out.append(f'<text transform="translate(18,{(T + H - B) / 2}) rotate(-90)" text-anchor="middle">retrieval accuracy (dev set)</text>')
    policies = sorted({p for p, _ in series})
    color = {p: COLORS[i % len(COLORS)] for i, p in enumerate(policies)}

    def marker(x, y, mode, c):
        if MARKERS.get(mode) == "square":
            return f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="{c}"/>'
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{c}"/>'

    for (policy, mode), pts in sorted(series.items()):
        pts = sorted(pts)
        c = color[policy]
        dash = ' stroke-dasharray="5,3"' if mode == "stream" else ""
        if len(pts) > 1:
            d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y, _ in pts)
            out.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="1.5"{dash}/>')
        for x, y, label in pts:
            out.append(marker(px(x), py(y), mode, c))
            out.append(f'<text x="{px(x) + 6:.1f}" y="{py(y) - 5:.1f}" font-size="9" fill="{c}">{html.escape(label)}</text>')
    for mode, (x, y) in sorted(references.items()):
        out.append(f'<path d="M {px(x):.1f} {py(y) - 7:.1f} l 6 12 l -12 0 z" fill="black"/>')
        out.append(f'<text x="{px(x) + 8:.1f}" y="{py(y) + 4:.1f}" font-size="10">full KV ({mode})</text>')
    ly = T + 10
    for p in policies:
        out.append(f'<line x1="{W - R + 15}" y1="{ly}" x2="{W - R + 40}" y2="{ly}" stroke="{color[p]}" stroke-width="2"/>')
        out.append(f'<text x="{W - R + 46}" y="{ly + 4}">{html.escape(p)}</text>')
        ly += 18
    ly += 8
    for mode in modes:
        out.append(marker(W - R + 27, ly, mode, "#555"))
        out.append(f'<text x="{W - R + 46}" y="{ly + 4}">{html.escape(mode)} mode{" (dashed)" if mode == "stream" else ""}</text>')
        ly += 18
    out.append(f'<text x="{W - R + 15}" y="{ly + 8}" font-size="10">labels: budget share</text>')
    out.append("</svg>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eval", nargs="+", required=True, help="eval retrieval --json outputs")
    ap.add_argument("--bench", nargs="*", default=[], help="tagged bench --json lines (gpu_quality_throughput.sh)")
    ap.add_argument("--eval-context", type=int, default=2048, help="tokens a budget is a share of in the eval")
    ap.add_argument("--svg", required=True)
    ap.add_argument("--table", required=True)
    ap.add_argument("--title", default="Retrieval accuracy (dev set, tiny model) vs output tok/s (Qwen3-8B shape, 256 x (128 -> 4096), H100)")
    args = ap.parse_args()

    acc = {}  # (policy, mode, share) -> (accuracy, budget, documents)
    full = {}
    for j in load(args.eval):
        if j.get("task") != "retrieval":
            continue
        if j.get("policy") == "full":
            full[j["mode"]] = j["accuracy"]
            continue
        if not j.get("applies", True):
            continue
        name = j.get("label") or j["policy"]
        acc[(name, j["mode"], share_key(j["budget"] / args.eval_context))] = (j["accuracy"], j["budget"], j["num_documents"])
    tps = {}  # (policy, share) -> (tok/s, budget)
    full_tps = None
    for j in load(args.bench) if args.bench else []:
        if j.get("policy") == "full":
            full_tps = j["output_tokens_per_second"]
        else:
            tps[(j["policy"], share_key(j["share"]))] = (j["output_tokens_per_second"], j.get("budget"))
    modes = sorted({m for _, m, _ in acc} | set(full))
    series, rows = {}, []
    for (policy, mode, share), (a, budget, n) in sorted(acc.items()):
        t = tps.get((policy, share))
        rows.append((policy, share, mode, budget, a, n, t))
        if t is not None:
            series.setdefault((policy, mode), []).append((t[0], a, f"{share * 100:g}%"))
    references = {m: (full_tps, full[m]) for m in full if full_tps is not None}
    write_svg(args.svg, series, references, args.title, modes)
    with open(args.table, "w", encoding="utf-8") as f:
        f.write("| policy | budget share | mode | eval budget (tokens) | accuracy | documents | GPU budget (tokens) | output tok/s |\n")
        f.write("|---|---|---|---|---|---|---|---|\n")
        for m in modes:
            if m in full:
                ft = f"{full_tps:,.0f}" if full_tps is not None else "n/a"
                f.write(f"| full | 100% | {m} | all | {full[m]:.2f} | | all | {ft} |\n")
        for policy, share, mode, budget, a, n, t in rows:
            ts = f"{t[0]:,.0f}" if t else "n/a"
            gb = t[1] if t and t[1] is not None else ""
            f.write(f"| {policy} | {share * 100:g}% | {mode} | {budget} | {a:.2f} | {n} | {gb} | {ts} |\n")
    print(f"wrote {args.svg} ({sum(len(v) for v in series.values())} points) and {args.table} ({len(rows)} rows)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
