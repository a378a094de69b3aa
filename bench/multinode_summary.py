#!/usr/bin/env python3
"""Summary of bench/multinode.sh: reads DIR/lat_*.json and DIR/moe_*.json, prints Markdown.

Usage: multinode_summary.py DIR [--check] [--routes mpi,ucx]

  - latency per route: ubep over each of its routes (one row each: across nodes a job times ubep over
    mpi and over ucx) and its MPI baselines, at the smallest and the largest size, with the ratios
    measured in the same job (never across jobs);
  - per MoE run and case: layer time of BSP and of each ubep route, combine mode and schedule, ubep/bsp
    per schedule, and topology / best(linear, shifted): below 1 the topology schedule wins; then per route
    and combine mode the range of ubep/bsp over all cases and schedules;
  - per MoE run and case the bytes per call and rank (dispatch/combine x on/off the node, mean and max over
    ranks) of BSP and of each ubep route and combine mode, and off-node bytes ubep/bsp;
  - per MoE run the mpi0 byte counters of every emulated node (emulate.sh --stats: the whole job on the
    wire) beside the off-node bytes the MoE layers counted over the whole job.
--check exits 1 when a file is missing a record the summary needs (every schedule for every route and
combine mode the run asked for, byte counts, link counters of a run across nodes; used by the smoke test);
with --routes, also when a latency run across nodes or a MoE run did not time ubep over exactly those routes.
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


def human(n):
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0


def link_counters(txt):
    """emulate.sh --stats lines of a run's output: {node index: (host, rx_bytes, tx_bytes)}."""
    out = {}
    if not os.path.exists(txt):
        return out
    for line in open(txt):
        m = re.match(r"# node (\d+) (\S+) mpi0: rx_bytes=(\d+) tx_bytes=(\d+)", line)
        if m:
            out[int(m.group(1))] = (m.group(2), int(m.group(3)), int(m.group(4)))
    return out


def moe_section(out, d, check, routes):
    files = sorted(glob.glob(os.path.join(d, "moe_*.json")))
    if check and not files:
        fail(f"no moe_*.json in {d}")
    verdicts = []
    for p in files:
        doc = load(p)
        name = os.path.basename(p)[:-5]
        modes = doc.get("combine") or ["per_expert"]
        cases, records = {}, {}
        for r in doc["results"]:
            key = (r["tokens"], r["hidden"], r["routing"], r["compute_us_per_token"])
            which = ((r.get("route", "default"), r["schedule"], r.get("combine", "per_expert"))
                     if r["impl"] == "ubep" else "bsp")
            cases.setdefault(key, {})[which] = r["layer_us"]
            records.setdefault(key, {})[which] = r
        have = sorted({w[0] for c in cases.values() for w in c if w != "bsp"})
        # A run of the default route only (moe_4x2_decode) times one route by design.
        asked = [r.get("asked") for r in doc.get("ubep_routes", [])]
        if check and routes and asked != ["default"] and have != sorted(routes):
            fail(f"{name}: ubep timed over the routes {have}, expected {sorted(routes)}")
        out.append(f"### {name}: {doc['ranks']} ranks on {doc['nodes']} nodes, routes used "
                   f"{', '.join(doc['routes'])}; layer time in microseconds (max over ranks, median over iterations)")
        out.append("")
        out.append("| tokens | hidden | routing | compute us/tok | ubep route | combine | bsp | linear | shifted "
                   "| topology | ubep/bsp lin | shf | top | top / best(lin, shf) |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        per_variant = {}
        for key in sorted(cases):
            c = cases[key]
            for route in have:
                for mode in modes:
                    # A run may time only some schedules (moe_4x2_decode: topology): the others print "-".
                    ran = [s for s in SCHEDULES if (route, s, mode) in c]
                    if not ran or "bsp" not in c:
                        if check:
                            fail(f"{name}: case {key}, route {route}, combine {mode} lacks a schedule or bsp")
                        continue
                    t = {s: c[(route, s, mode)] for s in ran}
                    tb = None
                    if len(ran) == len(SCHEDULES):
                        tb = t["topology"] / min(t["linear"], t["shifted"])
                        verdicts.append(tb)
                    per_variant.setdefault((route, mode), []).extend(t[s] / c["bsp"] for s in ran)
                    out.append("| " + " | ".join([str(key[0]), str(key[1]), key[2], fmt(key[3], 2), route, mode,
                                                  fmt(c["bsp"])] + [fmt(t[s]) if s in t else "-" for s in SCHEDULES] +
                                                 [fmt(t[s] / c["bsp"], 2) if s in t else "-" for s in SCHEDULES] +
                                                 [fmt(tb, 3) if tb is not None else "-"]) + " |")
        out.append("")
        if per_variant:
            out.append("ubep/bsp layer time over all cases and schedules, per route and combine mode: " + "; ".join(
                f"{route} {mode} {min(v):.2f} – {max(v):.2f} (median {statistics.median(v):.2f})"
                for (route, mode), v in sorted(per_variant.items())))
            out.append("")
        bytes_table(out, name, records, have, modes, check)
        link_table(out, name, doc, link_counters(p[:-5] + ".txt"), check)
    if verdicts:
        wins = sum(1 for v in verdicts if v < 1.0)
        out.append(f"**topology vs best(linear, shifted)**: wins {wins} of {len(verdicts)} cases (per route and "
                   f"combine mode); median ratio {statistics.median(verdicts):.3f} (below 1 = topology faster), "
                   f"range {min(verdicts):.3f} .. {max(verdicts):.3f}")
        out.append("")


def bytes_table(out, name, records, routes, modes, check):
    """Bytes per call and rank (the bench's LayerBase::traffic() counts; mean over ranks, max in parentheses)
    per case (the compute cost does not change them: the smallest one) and variant, beside BSP's."""
    keys = sorted(records)
    if not keys:
        return
    first_compute = {}
    for k in keys:
        first_compute.setdefault(k[:3], k)
    out.append(f"Bytes per call and rank, {name}, as the bench counts them (LayerBase::traffic(): token rows in "
               "dispatch, output/partial/node rows in combine; mean over ranks, max over ranks in parentheses; "
               "ubep at the topology schedule, the bytes do not depend on it):")
    out.append("")
    out.append("| tokens | hidden | routing | impl | route | combine | dispatch on-node | dispatch off-node "
               "| combine on-node | combine off-node | off-node ubep/bsp |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")

    def cells(rec):
        b = rec.get("bytes_per_call")
        if not b:
            if check:
                fail(f"{name}: record {rec.get('label', rec['impl'])} lacks bytes_per_call")
            return ["n/a"] * 4
        return [f"{human(b['mean'][k])} ({human(b['max'][k])})"
                for k in ("dispatch_on_node", "dispatch_off_node", "combine_on_node", "combine_off_node")]

    def off(rec):
        b = rec.get("bytes_per_call", {}).get("mean")
        return None if not b else b["dispatch_off_node"] + b["combine_off_node"]

    for k in first_compute.values():
        recs = records[k]
        bsp = recs.get("bsp")
        if bsp is None:
            continue
        out.append("| " + " | ".join([str(k[0]), str(k[1]), k[2], "bsp", "mpi", bsp.get("combine", "per_expert")] +
                                     cells(bsp) + ["1"]) + " |")
        for route in routes:
            for mode in modes:
                rec = recs.get((route, "topology", mode))
                if rec is None:
                    continue
                r = ratio(off(rec), off(bsp))
                out.append("| " + " | ".join([str(k[0]), str(k[1]), k[2], "ubep", route, mode] + cells(rec) +
                                             [fmt(r, 3) if r is not None else "n/a (none off the node)"]) + " |")
    out.append("")


def link_table(out, name, doc, counters, check):
    """The emulated links' own counters (emulate.sh --stats: each node's mpi0 over the whole job) beside the
    off-node bytes the bench's layers counted over the whole job (every call: checks, warm-up, timed)."""
    job = doc.get("job_traffic", {}).get("per_node", [])
    if not counters:
        if check and doc.get("nodes", 1) > 1:
            fail(f"{name}: no emulate.sh --stats link counters in {name}.txt")
        return
    out.append(f"Off-node bytes of {name} over the whole job: the emulated links (each node's mpi0, emulate.sh "
               "--stats; every byte on the wire: MPI and UCX headers and control, TCP/IP, the BSP counts exchange, "
               "barriers, the bench's own reductions) beside what the MoE layers counted as sent off the node "
               "(every layer and call):")
    out.append("")
    out.append("| node | host | mpi0 tx | mpi0 rx | layers' off-node bytes sent | mpi0 tx / layers |")
    out.append("|---|---|---|---|---|---|")
    by_host = {n["host"]: n for n in job}
    tot_tx = tot_rx = tot_bench = 0
    for i in sorted(counters):
        host, rx, tx = counters[i]
        n = by_host.get(host) or next((x for x in job if x["node"] == i), None)
        sent = None if n is None else n["off_node_sent"]
        if check and sent is None:
            fail(f"{name}: no job_traffic record for node {i} ({host})")
        tot_tx += tx
        tot_rx += rx
        tot_bench += sent or 0
        out.append(f"| {i} | {host} | {human(tx)} | {human(rx)} | {human(sent)} | {fmt(ratio(tx, sent), 2)} |")
    out.append(f"| all | | {human(tot_tx)} | {human(tot_rx)} | {human(tot_bench)} "
               f"| {fmt(ratio(tot_tx, tot_bench), 2)} |")
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
    out += ["## MoE dispatch/combine per route, combine mode and schedule", ""]
    moe_section(out, args.dir, check, routes)
    print("\n".join(out))


if __name__ == "__main__":
    main()
