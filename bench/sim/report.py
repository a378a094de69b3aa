#!/usr/bin/env python3
"""bench/sim/report.py OUT: the table (OUT/table.md), the numbers (OUT/summary.json) and the plot (OUT/scale.png)
of a bench/sim/run.sh run, from OUT/runs.jsonl and the ubep_moe_bench JSON files it names.

Per shape and scale: the wall time of the simulation, the simulated layer time (dispatch + combine, the
median over iterations of the maximum over ranks) of the BSP baseline and of every ubep layer (schedule /
combine mode), ubep / BSP per layer, and topology / linear per combine mode (the schedule's effect); and the
simulation of the BSP baseline's communication alone (ubep_sim_bsp_alone, no ubep code): its wall time and
simulated layer time, the part of the wall time that SimGrid's flow model takes for the all-to-all itself."""
import json
import os
import sys


def load(out):
    runs = []
    with open(os.path.join(out, "runs.jsonl")) as f:
        for line in f:
            if not line.strip():
                continue
            run = json.loads(line)
            run["rows"] = {}
            path = os.path.join(out, run["json"]) if run.get("json") else ""
            if run["status"] == "ok" and os.path.exists(path):
                with open(path) as g:
                    doc = json.load(g)
                run["nodes_seen"] = doc.get("nodes")
                for r in doc["results"]:
                    key = "bsp" if r["impl"] == "bsp" else f'{r["schedule"]}/{r["combine"]}'
                    run["rows"][key] = r["layer_us"]
            elif run["status"] == "ok":
                run["status"] = "no results (bench JSON missing)"
            runs.append(run)
    return runs


def main():
    args = [a for a in sys.argv[1:] if a != "--check"]
    if len(args) != 1:
        sys.exit("usage: bench/sim/report.py [--check] OUT (the --out directory of bench/sim/run.sh)")
    out = args[0]
    runs = load(out)
    labels = sorted({k for r in runs for k in r["rows"] if k != "bsp"})
    lines = ["# ubep_moe_bench under SimGrid SMPI (simulated time; bench/sim/run.sh)", "",
             "layer = dispatch + combine in simulated microseconds (median over iterations of the maximum over "
             "ranks); ubep/bsp and topology/linear are ratios of those medians in one simulation.", ""]
    head = ["shape", "ranks", "wall s", "status", "BSP alone: wall s", "BSP alone: us", "bsp us"] + \
           [f"{l} us" for l in labels] + [f"{l} ÷ bsp" for l in labels]
    modes = sorted({l.split("/")[1] for l in labels})
    head += [f"topology ÷ linear ({m})" for m in modes]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    summary = []
    for r in runs:
        rows = r["rows"]
        bsp = rows.get("bsp")
        alone = r.get("alone_status")
        w = r.get("alone_wall_s") or 0.0
        alone_wall = "-" if alone is None else (f"{w:.1f}" if w < 10 else f"{w:.0f}") + \
            ("" if alone == "ok" else f" ({alone})")
        alone_us = f'{r["alone_us"]:.1f}' if r.get("alone_us") else "-"
        cells = [r["shape"], str(r["ranks"]), f'{r["wall_s"]:.0f}', r["status"], alone_wall, alone_us,
                 f"{bsp:.1f}" if bsp else "-"]
        cells += [f"{rows[l]:.1f}" if l in rows else "-" for l in labels]
        ratios = {l: rows[l] / bsp for l in labels if l in rows and bsp}
        cells += [f"{ratios[l]:.3f}" if l in ratios else "-" for l in labels]
        topo = {}
        for m in modes:
            t, lin = rows.get(f"topology/{m}"), rows.get(f"linear/{m}")
            if t and lin:
                topo[m] = t / lin
            cells.append(f"{topo[m]:.3f}" if m in topo else "-")
        lines.append("| " + " | ".join(cells) + " |")
        summary.append({k: r.get(k) for k in ("shape", "ranks", "status", "wall_s", "alone_status", "alone_wall_s",
                                             "alone_us")} |
                       {"layer_us": rows, "ubep_over_bsp": ratios, "topology_over_linear": topo})
    cost = os.path.join(out, "rma_cost.txt")
    if os.path.exists(cost):
        with open(cost) as f:
            lines += ["", "SMPI's price of ubep's mpi-route protocol, same bytes (ubep_sim_rma_cost, smallest scale):",
                      "", "```"] + [l.rstrip() for l in f if l.strip()] + ["```"]
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    print("\n".join(lines))
    if "--check" in sys.argv:
        bad = [f'{r["shape"]} at {r["ranks"]} ranks: {r["status"]}' for r in runs
               if r["status"] != "ok" and not r["status"].startswith("not run")]
        bad += [f'{r["shape"]} at {r["ranks"]} ranks: the bench saw {r.get("nodes_seen")} nodes, the platform has '
                f'{r["nodes"]}' for r in runs if r["status"] == "ok" and r.get("nodes_seen") != r.get("nodes")]
        bad += [f'{r["shape"]} at {r["ranks"]} ranks: no BSP row' for r in runs if r["status"] == "ok" and
                "bsp" not in r["rows"]]
        bad += [f'{r["shape"]} at {r["ranks"]} ranks, BSP alone: {r["alone_status"]}' for r in runs
                if r.get("alone_status", "ok") != "ok"]
        if bad:
            sys.exit("report.py --check: " + "; ".join(bad))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report.py: no matplotlib (apt-get install python3-matplotlib); table only", file=sys.stderr)
        return
    shapes = sorted({r["shape"] for r in runs})
    fig, axes = plt.subplots(1, len(shapes) + 1, figsize=(5 * (len(shapes) + 1), 4))
    for ax, shape in zip(axes, shapes):
        done = [r for r in runs if r["shape"] == shape and r["rows"]]
        for key in ["bsp"] + labels:
            pts = [(r["ranks"], r["rows"][key]) for r in done if key in r["rows"]]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=key)
        ax.set(xscale="log", yscale="log", xlabel="simulated ranks", ylabel="layer time, simulated us",
               title=f"{shape}")
        ax.legend(fontsize=7)
    ax = axes[-1]
    for shape in shapes:
        pts = [(r["ranks"], r["wall_s"]) for r in runs if r["shape"] == shape and r["wall_s"] > 0]
        if pts:
            ax.plot(*zip(*pts), marker="s", label=f"{shape}: ubep_moe_bench")
        pts = [(r["ranks"], r["alone_wall_s"]) for r in runs if r["shape"] == shape and r.get("alone_wall_s")]
        if pts:
            ax.plot(*zip(*pts), marker="^", linestyle="--", label=f"{shape}: BSP alone (no ubep)")
    ax.set(xscale="log", yscale="log", xlabel="simulated ranks", ylabel="wall time of the simulation, s",
           title="wall time")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "scale.png"), dpi=110)
    print(f"plot: {os.path.join(out, 'scale.png')}")


if __name__ == "__main__":
    main()
