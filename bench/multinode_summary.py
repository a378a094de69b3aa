#!/usr/bin/env python3
"""Summary of bench/multinode.sh: reads DIR/lat_*.json and DIR/moe_*.json, prints Markdown.

Usage: multinode_summary.py DIR [--check]

  - latency per route: ubep and its MPI baselines at the smallest and the largest size, with the ratios
    measured in the same job (never across jobs);
  - per MoE run and case: layer time of BSP and of each ubep schedule, ubep/bsp per schedule, and
    topology / best(linear, shifted): below 1 the topology schedule wins;
  - the mpi0 byte counters per node when the run printed them (emulate.sh --stats).
--check exits 1 when a file is missing a record the summary needs (used by the smoke test).
"""
import glob
import json
import os
import re
import statistics
import sys

ROUTES = [("shm", "shm (1 node)"), ("mpi1", "mpi (1 node, forced)"), ("node", "mpi (2 nodes, 1 switch)"),
          ("spine", "mpi (2 nodes, across the spine)")]
SCHEDULES = ["linear", "shifted", "topology"]


def fail(msg):
    print(f"multinode_summary: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def load(path):
    with open(path) as f:
        return json.load(f)


def value(doc, impl, size, metric="latency_us"):
    for r in doc["results"]:
        if r["impl"] == impl and r["size"] == size:
            return r.get(metric)
    return None


def fmt(v, digits=1):
    return "n/a" if v is None else f"{v:.{digits}f}"


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def latency_section(out, d, check):
    for bench, base, label in [("signal_latency", "mpi_sendrecv", "MPI_Send/Recv"),
                               ("put_latency", "mpi_rma", "MPI_Put+flush (allocate)")]:
        docs = {}
        for key, _ in ROUTES:
            p = os.path.join(d, f"lat_{bench}_{key}.json")
            if os.path.exists(p):
                docs[key] = load(p)
            elif check:
                fail(f"{p} is missing")
        if not docs:
            continue
        sizes = sorted({r["size"] for doc in docs.values() for r in doc["results"]})
        small, large = sizes[0], sizes[-1]
        out.append(f"### {bench}: ubep vs {label}, microseconds (same job per row)")
        out.append("")
        out.append(f"| route | ubep {small} B | {base} {small} B | ratio | ubep {large} B | {base} {large} B | ratio |")
        out.append("|---|---|---|---|---|---|---|")
        for key, name in ROUTES:
            if key not in docs:
                continue
            doc = docs[key]
            row = [name]
            for s in (small, large):
                u, b = value(doc, "ubep", s), value(doc, base, s)
                if check and (u is None or b is None):
                    fail(f"lat_{bench}_{key}: no ubep/{base} value at {s} B")
                row += [fmt(u), fmt(b), fmt(ratio(u, b), 2)]
            out.append("| " + " | ".join(row) + " |")
        out.append("")


def moe_section(out, d, check):
    files = sorted(glob.glob(os.path.join(d, "moe_*.json")))
    if check and not files:
        fail(f"no moe_*.json in {d}")
    verdicts = []
    for p in files:
        doc = load(p)
        name = os.path.basename(p)[:-5]
        cases = {}
        for r in doc["results"]:
            key = (r["tokens"], r["hidden"], r["routing"], r["compute_us_per_token"])
            cases.setdefault(key, {})[r["schedule"] if r["impl"] == "ubep" else "bsp"] = r["layer_us"]
        out.append(f"### {name}: {doc['ranks']} ranks on {doc['nodes']} nodes, routes {', '.join(doc['routes'])}; "
                   "layer time in microseconds (max over ranks, median over iterations)")
        out.append("")
        out.append("| tokens | hidden | routing | compute us/tok | bsp | linear | shifted | topology "
                   "| ubep/bsp lin | shf | top | top / best(lin, shf) |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for key in sorted(cases):
            c = cases[key]
            missing = [s for s in SCHEDULES + ["bsp"] if s not in c]
            if missing:
                if check:
                    fail(f"{name}: case {key} lacks {missing}")
                continue
            best_other = min(c["linear"], c["shifted"])
            tb = c["topology"] / best_other
            verdicts.append(tb)
            out.append("| " + " | ".join([str(key[0]), str(key[1]), key[2], fmt(key[3], 2), fmt(c["bsp"]),
                                          fmt(c["linear"]), fmt(c["shifted"]), fmt(c["topology"])] +
                                         [fmt(c[s] / c["bsp"], 2) for s in SCHEDULES] + [fmt(tb, 3)]) + " |")
        out.append("")
        txt = p[:-5] + ".txt"
        if os.path.exists(txt):
            counters = [line.strip("# \n") for line in open(txt) if re.match(r"# node \d+ .* mpi0: rx_bytes=", line)]
            if counters:
                out.append("mpi0 byte counters per node (emulate.sh --stats): " + "; ".join(counters))
                out.append("")
    if verdicts:
        wins = sum(1 for v in verdicts if v < 1.0)
        out.append(f"**topology vs best(linear, shifted)**: wins {wins} of {len(verdicts)} cases; "
                   f"median ratio {statistics.median(verdicts):.3f} (below 1 = topology faster), "
                   f"range {min(verdicts):.3f} .. {max(verdicts):.3f}")
        out.append("")


def main():
    args = [a for a in sys.argv[1:] if a != "--check"]
    check = "--check" in sys.argv[1:]
    if len(args) != 1 or not os.path.isdir(args[0]):
        fail("usage: multinode_summary.py DIR [--check]")
    out = ["## Latency per route", ""]
    latency_section(out, args[0], check)
    out += ["## MoE dispatch/combine per schedule", ""]
    moe_section(out, args[0], check)
    print("\n".join(out))


if __name__ == "__main__":
    main()
