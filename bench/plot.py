#!/usr/bin/env python3
"""Plots the JSON output of the ubep OSU-style benchmarks: one line per implementation, log-log.

Usage:
  mpirun -np 2 ./ubep_signal_latency --json signal.json
  python3 bench/plot.py signal.json [more.json ...] -o signal.png

Latency files (latency_us) and bandwidth files (bandwidth_mb_s) may not be mixed in one plot. One line per
implementation and route (ubep has one per route when a run timed it over mpi and ucx), labelled
"<impl> (<route>)", with several files "<impl> (<route>, <file>)". Size 0 cannot sit on a log axis and is
left out.
Needs python3-matplotlib (Debian package).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402

METRICS = {"latency_us": "latency (us)", "bandwidth_mb_s": "bandwidth (MB/s, 10^6 B/s)"}


def load(path):
    with open(path) as f:
        doc = json.load(f)
    if "results" not in doc:
        sys.exit(f"plot.py: {path} is not the JSON of a ubep benchmark (no 'results')")
    return doc


def metric_of(doc, path):
    found = {m for r in doc["results"] for m in METRICS if m in r}
    if len(found) != 1:
        sys.exit(f"plot.py: {path}: expected one metric of {sorted(METRICS)}, found {sorted(found)}")
    return found.pop()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", nargs="+", help="JSON files written with --json FILE")
    p.add_argument("-o", "--output", help="PNG to write (default: the first JSON file with .png)")
    p.add_argument("--title", help="plot title (default: the benchmark name and the ubep route)")
    args = p.parse_args()

    docs = [(path, load(path)) for path in args.json]
    metrics = {metric_of(doc, path) for path, doc in docs}
    if len(metrics) != 1:
        sys.exit("plot.py: cannot mix latency and bandwidth files in one plot")
    metric = metrics.pop()

    fig, ax = plt.subplots(figsize=(8, 5))
    for path, doc in docs:
        lines = list(dict.fromkeys((r["impl"], r["route"]) for r in doc["results"]))
        for impl, route in lines:
            points = sorted(
                (r["size"], r[metric])
                for r in doc["results"]
                if (r["impl"], r["route"]) == (impl, route) and r.get(metric) is not None and r["size"] > 0
            )
            if not points:
                continue
            label = f"{impl} ({route})" if len(docs) == 1 else f"{impl} ({route}, {os.path.basename(path)})"
            ax.plot([s for s, _ in points], [v for _, v in points], marker="o", markersize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel(METRICS[metric])
    first = docs[0][1]
    routes = ", ".join(first.get("routes") or [first["route"]])
    ax.set_title(args.title or f"{first['benchmark']} (ubep routes: {routes}, {first['ranks']} ranks)")
    ax.grid(True, which="both", linewidth=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    out = args.output or os.path.splitext(args.json[0])[0] + ".png"
    fig.savefig(out, dpi=120)
    print(f"plot.py: wrote {out}")


if __name__ == "__main__":
    main()
