#!/usr/bin/env python3
"""Summary of bench/multinode.sh: reads DIR/lat_*.json and DIR/moe_*.json, prints Markdown.

Usage: multinode_summary.py DIR [--check] [--routes mpi,ucx]

  - latency per route: ubep over each of its routes (one row each: across nodes a job times ubep over
    mpi and over ucx) and its MPI baselines, at the smallest and the largest size, with the ratios
    measured in the same job (never across jobs);
  - per MoE run and case: layer time of BSP and of each ubep route and schedule, ubep/bsp per route and
    schedule, and topology / best(linear, shifted): below 1 the topology schedule wins; then per route
    the range of ubep/bsp over all cases and schedules;
  - the mpi0 byte counters per node when the run printed them (emulate.sh --stats).
--check exits 1 when a file is missing a record the summary needs (used by the smoke test); with
--routes, also when a latency run across nodes or a MoE run did not time ubep over exactly those routes.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

# The latency jobs of bench/multinode.sh: file key, where the two ranks run; OFF_NODE: peers on two nodes.
PLACES = [("shm", "1 node"), ("mpi1", "1 node, UBEP_TRANSPORTS=mpi"), ("node", "2 nodes, 1 switch"),
          ("spine", "2 nodes, across the spine")]
OFF_NODE = {"node", "spine"}
SCHEDULES = ["linear", "shifted", "topology"]


def fail(msg):
    print(f"multinode_summary: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def load(path):
    with open(path) as f:
        return json.load(f)


def value(doc, impl, size, route=None, metric="latency_us"):
    for r in doc["results"]:
        if r["impl"] == impl and r["size"] == size and (route is None or r["route"] == route):
            return r.get(metric)
    return None


def ubep_routes(doc):
    """The routes a latency job timed ubep over (one before the JSON had "routes")."""
    return doc.get("routes") or [doc["route"]]


def fmt(v, digits=1):
    return "n/a" if v is None else f"{v:.{digits}f}"


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def latency_section(out, d, check, routes):
    for bench, base, label in [("signal_latency", "mpi_sendrecv", "MPI_Send/Recv"),
                               ("put_latency", "mpi_rma", "MPI_Put+flush (allocate)")]:
        docs = {}
        for key, _ in PLACES:
            p = os.path.join(d, f"lat_{bench}_{key}.json")
            if os.path.exists(p):
                docs[key] = load(p)
            elif check:
                fail(f"{p} is missing")
        if not docs:
            continue
        sizes = sorted({r["size"] for doc in docs.values() for r in doc["results"]})
        small, large = sizes[0], sizes[-1]
        out.append(f"### {bench}: ubep per route vs {label}, microseconds (same job per place)")
        out.append("")
        out.append(f"| ubep route | place | ubep {small} B | {base} {small} B | ratio | ubep {large} B "
                   f"| {base} {large} B | ratio |")
        out.append("|---|---|---|---|---|---|---|---|")
        for key, place in PLACES:
            if key not in docs:
                continue
            doc = docs[key]
            have = ubep_routes(doc)
            if check and routes and key in OFF_NODE and sorted(have) != sorted(routes):
                fail(f"lat_{bench}_{key}: ubep timed over {have}, expected {routes} in the same job")
            for route in have:
                row = [route + (" (default)" if route == doc["route"] and len(have) > 1 else ""), place]
                for s in (small, large):
                    u, b = value(doc, "ubep", s, route), value(doc, base, s)
                    if check and (u is None or b is None):
                        fail(f"lat_{bench}_{key}: no ubep ({route}) / {base} value at {s} B")
                    row += [fmt(u), fmt(b), fmt(ratio(u, b), 2)]
                out.append("| " + " | ".join(row) + " |")
        out.append("")


def moe_section(out, d, check, routes):
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
            which = (r.get("route", "default"), r["schedule"]) if r["impl"] == "ubep" else "bsp"
            cases.setdefault(key, {})[which] = r["layer_us"]
        have = sorted({w[0] for c in cases.values() for w in c if w != "bsp"})
        if check and routes and have != sorted(routes):
            fail(f"{name}: ubep timed over the routes {have}, expected {sorted(routes)}")
        out.append(f"### {name}: {doc['ranks']} ranks on {doc['nodes']} nodes, routes used "
                   f"{', '.join(doc['routes'])}; layer time in microseconds (max over ranks, median over iterations)")
        out.append("")
        out.append("| tokens | hidden | routing | compute us/tok | ubep route | bsp | linear | shifted | topology "
                   "| ubep/bsp lin | shf | top | top / best(lin, shf) |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        per_route = {}
        for key in sorted(cases):
            c = cases[key]
            for route in have:
                missing = [s for s in SCHEDULES if (route, s) not in c] + ([] if "bsp" in c else ["bsp"])
                if missing:
                    if check:
                        fail(f"{name}: case {key}, route {route} lacks {missing}")
                    continue
                t = {s: c[(route, s)] for s in SCHEDULES}
                tb = t["topology"] / min(t["linear"], t["shifted"])
                verdicts.append(tb)
                per_route.setdefault(route, []).extend(t[s] / c["bsp"] for s in SCHEDULES)
                out.append("| " + " | ".join([str(key[0]), str(key[1]), key[2], fmt(key[3], 2), route, fmt(c["bsp"])] +
                                             [fmt(t[s]) for s in SCHEDULES] +
                                             [fmt(t[s] / c["bsp"], 2) for s in SCHEDULES] + [fmt(tb, 3)]) + " |")
        out.append("")
        if per_route:
            out.append("ubep/bsp layer time over all cases and schedules, per route: " + "; ".join(
                f"{route} {min(v):.2f} – {max(v):.2f} (median {statistics.median(v):.2f})"
                for route, v in sorted(per_route.items())))
            out.append("")
        txt = p[:-5] + ".txt"
        if os.path.exists(txt):
            counters = [line.strip("# \n") for line in open(txt) if re.match(r"# node \d+ .* mpi0: rx_bytes=", line)]
            if counters:
                out.append("mpi0 byte counters per node (emulate.sh --stats): " + "; ".join(counters))
                out.append("")
    if verdicts:
        wins = sum(1 for v in verdicts if v < 1.0)
        out.append(f"**topology vs best(linear, shifted)**: wins {wins} of {len(verdicts)} cases (per route); "
                   f"median ratio {statistics.median(verdicts):.3f} (below 1 = topology faster), "
                   f"range {min(verdicts):.3f} .. {max(verdicts):.3f}")
        out.append("")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--check", action="store_true")
    p.add_argument("--routes", help="with --check: the routes ubep must be timed over, e.g. mpi,ucx")
    args = p.parse_args()
    if not os.path.isdir(args.dir):
        fail(f"{args.dir} is not a directory")
    check, routes = args.check, args.routes.split(",") if args.routes else None
    out = ["## Latency per route", ""]
    latency_section(out, args.dir, check, routes)
    out += ["## MoE dispatch/combine per route and schedule", ""]
    moe_section(out, args.dir, check, routes)
    print("\n".join(out))


if __name__ == "__main__":
    main()
