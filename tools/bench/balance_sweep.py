#!/usr/bin/env python3
"""The balancer's predicted gains (docs/performance.md, "The balancer's programs").

Runs `efccl plan --json` on NIMBLE's hotspot sweep and the other scenarios of issue 18 and
prints one markdown table per scenario: the busiest link's load (the planner's objective) and
the timing model's time of the generated programs, every pair on its default path ("direct")
against the plan ("balanced"). With --svg FILE it also draws the nimble-h100 x2 sweep (predicted
time against the hotspot ratio, one line pair per size) and --heat FILE the link loads of one
point (efccl plan --svg).

    python3 tools/bench/balance_sweep.py --efccl build/bin/efccl --svg docs/balance-sweep.svg
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

MiB = 1 << 20


def hotspot(n, per_rank, hot, unit=MiB):
    """NIMBLE's skewed all-to-all: a fraction `hot` of every rank's bytes goes to rank 0, the
    rest evenly to the others (rank 0 spreads all of its bytes); pairs in whole `unit`s."""
    rows = []
    for s in range(n):
        row = []
        for t in range(n):
            if s == t:
                row.append(0)
                continue
            share = hot if t == 0 else (1 - hot) / (n - (1 if s == 0 else 2))
            if s == 0:
                share = 1 / (n - 1)
            row.append(int(share * per_rank) // unit * unit)
        rows.append(row)
    return rows


def moe(n, tokens=16384, hidden=4096, top_k=2, hot_share=1 / 3, granule=32):
    """MoE dispatch: every rank routes `tokens` tokens of `hidden` bf16 values to top_k experts,
    one expert group per rank; the hot expert's rank (1) takes `hot_share` of the routed copies,
    the other ranks the rest evenly, in whole `granule`s of tokens (so that the program's chunks
    can be 256 KiB: the runtime sends what is left of a pair outside the program). Tokens routed
    to the rank itself stay local (no bytes)."""
    token = hidden * 2
    copies = tokens * top_k
    rows = []
    for s in range(n):
        row = []
        for t in range(n):
            share = hot_share if t == 1 else (1 - hot_share) / (n - 1)
            row.append(0 if s == t else int(share * copies) // granule * granule * token)
        rows.append(row)
    return rows


def transpose(rows):
    return [list(r) for r in zip(*rows)]


def plan(efccl, preset, nodes, rows, extra=()):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"ranks": len(rows), "bytes": rows}, f)
        path = f.name
    try:
        cmd = [efccl, "plan", "--topology", preset, "--nodes", str(nodes), "--demand", path,
               "--json", *extra]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return json.loads(out)
    finally:
        os.unlink(path)


def row(label, j):
    gain_load = j["direct_max_load_us"] / j["max_load_us"] if j["max_load_us"] else 1
    gain_time = (j["direct_predicted_us"] / j["predicted_us"]) if j["predicted_us"] else 1
    return (f"| {label} | {j['direct_max_load_us']:.0f} | {j['max_load_us']:.0f} | "
            f"{gain_load:.2f}x | {j['direct_predicted_us']:.0f} | {j['predicted_us']:.0f} | "
            f"{gain_time:.2f}x | {j['chunk_bytes'] // 1024} |")


HEADER = ("| {} | direct max load µs | balanced max load µs | load gain | direct predicted µs | "
          "balanced predicted µs | predicted gain | chunk KiB |\n|---|---|---|---|---|---|---|---|")


def chart(out, x0, title, subtitle, ylabel, series, xs, ymax, yfmt):
    """One line chart at x offset x0: series are (label, colour, dashed, [(x, y)])."""
    w, h, left, top, right, bottom = 520, 430, 64, 64, 16, 110
    def x(v):
        return x0 + left + (v - xs[0]) / (xs[-1] - xs[0]) * (w - left - right)
    def y(v):
        return h - bottom - v / ymax * (h - top - bottom)
    out.append(f'<text x="{x0 + left}" y="24" font-size="14" font-weight="bold" fill="#222">'
               f"{title}</text>")
    out.append(f'<text x="{x0 + left}" y="42" font-size="11" fill="#444">{subtitle}</text>')
    for k in range(6):
        v = ymax * k / 5
        out.append(f'<line x1="{x0 + left}" y1="{y(v):.1f}" x2="{x0 + w - right}" y2="{y(v):.1f}" '
                   'stroke="#dddddd"/>')
        out.append(f'<text x="{x0 + left - 8}" y="{y(v) + 4:.1f}" font-size="11" '
                   f'text-anchor="end" fill="#444">{yfmt(v)}</text>')
    for v in xs:
        out.append(f'<text x="{x(v):.1f}" y="{h - bottom + 18}" font-size="11" '
                   f'text-anchor="middle" fill="#444">{v:.1f}</text>')
    out.append(f'<text x="{x0 + (left + w - right) / 2}" y="{h - bottom + 38}" font-size="12" '
               'text-anchor="middle" fill="#222">hotspot ratio (share of every rank\'s bytes to '
               "rank 0)</text>")
    mid = (top + h - bottom) / 2
    out.append(f'<text x="{x0 + 16}" y="{mid}" font-size="12" fill="#222" '
               f'transform="rotate(-90 {x0 + 16} {mid})" text-anchor="middle">{ylabel}</text>')
    for i, (label, colour, dashed, pts) in enumerate(series):
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        line = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in pts)
        out.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        for a, b in pts:
            out.append(f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="3" fill="{colour}"/>')
        lx = x0 + left + (i % 2) * 230
        ly = h - bottom + 60 + (i // 2) * 16
        out.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 24}" y2="{ly - 4}" stroke="{colour}" '
                   f'stroke-width="2"{dash}/>')
        out.append(f'<text x="{lx + 30}" y="{ly}" font-size="11" fill="#222">{label}</text>')


def sweep_svg(points, path):
    """Left: predicted time against the hotspot ratio (direct dashed, balanced solid); right:
    the gain, predicted (solid) and of the busiest link's load (dashed). One colour per size."""
    colours = ["#2467c9", "#3d8a00", "#c0392b", "#8e44ad"]
    xs = sorted({p[1] for p in points})
    sizes = sorted({p[0] for p in points})
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="1060" height="430" '
           'viewBox="0 0 1060 430" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">',
           '<rect width="1060" height="430" fill="#ffffff"/>']
    times, gains = [], []
    for i, size in enumerate(sizes):
        c = colours[i % len(colours)]
        line = sorted(p for p in points if p[0] == size)
        times.append((f"{size} MiB a rank, direct", c, True, [(p[1], p[2] / 1000) for p in line]))
        times.append((f"{size} MiB a rank, balanced", c, False, [(p[1], p[3] / 1000) for p in line]))
        gains.append((f"{size} MiB, busiest link's load", c, True, [(p[1], p[5] / p[4]) for p in line]))
        gains.append((f"{size} MiB, predicted time", c, False, [(p[1], p[2] / p[3]) for p in line]))
    tmax = max(b for _, _, _, pts in times for _, b in pts) * 1.08
    gmax = max(b for _, _, _, pts in gains for _, b in pts) * 1.15
    chart(out, 0, "NIMBLE hotspot sweep: 2 hosts × nimble-h100, 8 ranks",
          "timing model on the programs efccl plan generates", "predicted time, ms", times, xs,
          tmax, lambda v: f"{v:.0f}")
    chart(out, 530, "Gain of balancing (direct / balanced)",
          "dashed: the planner's objective; solid: the timing model", "gain", gains, xs, gmax,
          lambda v: f"{v:.1f}x")
    out.append("</svg>\n")
    with open(path, "w") as f:
        f.write("\n".join(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--efccl", default="build/bin/efccl")
    ap.add_argument("--svg", help="draw the nimble-h100 x2 sweep here")
    ap.add_argument("--heat", help="link loads of nimble-h100 x2, 256 MiB, hotspot 0.5, here")
    args = ap.parse_args()
    ratios = [0.1, 0.3, 0.5, 0.7, 0.9]

    print(HEADER.format("nimble-h100 ×2, 8 ranks: MiB a rank, hotspot"))
    points = []
    for size in (64, 256, 1024):
        for hot in ratios:
            j = plan(args.efccl, "nimble-h100", 2, hotspot(8, size * MiB, hot))
            points.append((size, hot, j["direct_predicted_us"], j["predicted_us"],
                           j["max_load_us"], j["direct_max_load_us"]))
            print(row(f"{size}, {hot}", j))
    if args.svg:
        sweep_svg(points, args.svg)
    if args.heat:
        plan(args.efccl, "nimble-h100", 2, hotspot(8, 256 * MiB, 0.5), ["--svg", args.heat])

    print()
    print("| lone pair, 1 GiB | relays | direct predicted GB/s | balanced predicted GB/s | "
          "paths |\n|---|---|---|---|---|")
    gib = 1024 * MiB
    for label, nodes, dst in (("nimble-h100, gpu0 → gpu1", 1, 1),
                              ("nimble-h100 ×2, h0.gpu0 → h1.gpu0", 2, 4)):
        for relays in ("forward", "slot-device"):
            n = 4 * nodes
            rows = [[gib if (s == 0 and t == dst) else 0 for t in range(n)] for s in range(n)]
            j = plan(args.efccl, "nimble-h100", nodes, rows, ["--relays", relays])
            paths = ", ".join(
                f"{j['pairs'][0]['via'][p['candidate']]} {p['bytes'] / gib:.2f}"
                for p in j["pairs"][0]["paths"])
            print(f"| {label} | {relays} | {gib / j['direct_predicted_us'] / 1e3:.0f} | "
                  f"{gib / j['predicted_us'] / 1e3:.0f} | {paths} |")

    print()
    print(HEADER.format("dgx-h100: hosts, ranks, MiB a rank, hotspot"))
    for nodes, size in ((1, 1024), (4, 256)):
        for hot in ratios:
            j = plan(args.efccl, "dgx-h100", nodes, hotspot(8 * nodes, size * MiB, hot))
            print(row(f"{nodes}, {8 * nodes}, {size}, {hot}", j))

    print()
    print(HEADER.format("MoE, 16K tokens × 4096 bf16, top-2, hot expert on rank 1: preset, phase"))
    for preset, nodes in (("nimble-h100", 2), ("dgx-h100", 1), ("dgx-h100", 2)):
        n = 4 * nodes if preset == "nimble-h100" else 8 * nodes
        dispatch = moe(n)
        for phase, rows in (("dispatch", dispatch), ("combine", transpose(dispatch))):
            j = plan(args.efccl, preset, nodes, rows)
            print(row(f"{preset} ×{nodes} ({n} ranks), {phase}", j))

    print()
    print(HEADER.format("h200-nv18-x2 (NVLink + host memory): demand"))
    for label, rows in (("0 → 1, 1 GiB", [[0, 1024 * MiB], [0, 0]]),
                        ("both ways, 1 GiB each", [[0, 1024 * MiB], [1024 * MiB, 0]]),
                        ("0 → 1, 64 MiB", [[0, 64 * MiB], [0, 0]])):
        j = plan(args.efccl, "h200-nv18-x2", 1, rows)
        print(row(label, j))
    return 0


if __name__ == "__main__":
    sys.exit(main())
