#!/usr/bin/env python3
"""bench/sim/calibrate_report.py: the numbers of bench/sim/calibrate.sh.

    calibrate_report.py --fit LAT.json     one-way latency (us, the 8 B ping-pong) and bandwidth (MB/s, 1 / the
                                           least-squares slope of time over size from 64 KiB on) of the
                                           MPI_Send/MPI_Recv column of a ubep_signal_latency JSON file
    calibrate_report.py [--check] OUT      the table: simulated / emulated per link size and per MoE case
                                           (layer time: dispatch + combine, median over iterations of the
                                           maximum over ranks), the ±25% goal per case, and ubep / BSP in both
--check: exit 1 when a case has no counterpart, or when a simulated ping-pong does not give back the link it
was built from (the fit's latency at 8 B and latency + 1 MiB / bandwidth at 1 MiB, within 10%).
"""
import json
import os
import sys

GOAL = 0.25
FIT_FROM = 65536
SIZES = (8, 4096, 65536, 1048576)


def column(path, impl="mpi_sendrecv", route=None):
    with open(path) as f:
        doc = json.load(f)
    return {r["size"]: r["latency_us"] for r in doc["results"]
            if r["impl"] == impl and r.get("available", True) and (route is None or r.get("route") == route)}


sendrecv = column


def fit(path):
    t = sendrecv(path)
    pts = [(s, us) for s, us in sorted(t.items()) if s >= FIT_FROM]
    if 8 not in t or len(pts) < 2:
        sys.exit(f"calibrate_report.py: {path} lacks the 8 B time or two sizes from {FIT_FROM} B on")
    n = len(pts)
    mx = sum(s for s, _ in pts) / n
    my = sum(us for _, us in pts) / n
    slope = sum((s - mx) * (us - my) for s, us in pts) / sum((s - mx) ** 2 for s, _ in pts)  # us per byte
    if slope <= 0:
        sys.exit(f"calibrate_report.py: {path}: time does not grow with size from {FIT_FROM} B on (slope {slope})")
    return t[8], 1.0 / slope  # bytes per us = MB/s


def moe(path):
    with open(path) as f:
        doc = json.load(f)
    return {(r["tokens"], r["label"]): r["layer_us"] for r in doc["results"]}


def verdict(ratio):
    return "yes" if abs(ratio - 1.0) <= GOAL else "no"


def main():
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--fit":
        lat, bw = fit(args[1])
        print(f"{lat:.4f} {bw:.1f}")
        return
    check = "--check" in args
    args = [a for a in args if a != "--check"]
    if len(args) != 1:
        sys.exit(__doc__)
    out = args[0]
    missing = []
    lines = ["Links: one-way latency (ubep_signal_latency: MPI_Send/MPI_Recv, and ubep's mpi route), simulated on "
             "the platform built from the fit / emulated:", "",
             "| link | " + " | ".join(f"{s} B emulated us | simulated us | sim ÷ emu" for s in SIZES) + " |",
             "|---|" + "---|---|---|" * len(SIZES)]
    unfaithful = []
    for name, what, impl in (("link_node", "between nodes", "mpi_sendrecv"),
                             ("link_node_shaped", "between nodes, shaped", "mpi_sendrecv"),
                             ("link_onnode", "on one node", "mpi_sendrecv"),
                             ("link_node", "between nodes: ubep put_signal + wait_until, mpi route", "ubep")):
        route = "mpi" if impl == "ubep" else None
        emu = column(os.path.join(out, f"{name}.json"), impl, route)
        sim = column(os.path.join(out, f"sim_{name}.json"), impl, route)
        cells = []
        for s in SIZES:
            if s in emu and s in sim:
                cells += [f"{emu[s]:.3f}", f"{sim[s]:.3f}", f"{sim[s] / emu[s]:.2f}"]
                if impl == "mpi_sendrecv" and s in (8, 1048576):
                    lat, bw = fit(os.path.join(out, f"{name}.json"))
                    want = lat if s == 8 else lat + s / bw  # what the platform was built from
                    if abs(sim[s] / want - 1.0) > 0.10:
                        unfaithful.append(f"{what} at {s} B: simulated {sim[s]:.3f} us, the fit {want:.3f} us")
            else:
                cells += ["-", "-", "-"]
                missing.append(f"{name} {impl} {s} B")
        lines.append(f"| {what} | " + " | ".join(cells) + " |")
    lines += ["", "MoE layer (ubep_moe_bench, route mpi, uniform routing, no expert compute), predicted = simulated, "
              f"measured = emulated; goal: within ±{GOAL:.0%}:", "",
              "| case | tokens/rank | layer | measured us | predicted us | predicted ÷ measured | within ±25% | "
              "ubep ÷ bsp measured | ubep ÷ bsp predicted |", "|---|---|---|---|---|---|---|---|---|"]
    summary = []
    for case, what in (("4x1", "4 nodes x 1 rank, 2 switches, shaped"), ("2x2", "2 nodes x 2 ranks, unshaped")):
        emu, sim = moe(os.path.join(out, f"emu_moe_{case}.json")), moe(os.path.join(out, f"sim_moe_{case}.json"))
        for key in sorted(emu, key=lambda k: (k[0], k[1] != "bsp", k[1])):
            tokens, label = key
            if key not in sim:
                missing.append(f"{case} {tokens} {label}")
                continue
            r = sim[key] / emu[key]
            bsp_e, bsp_s = emu.get((tokens, "bsp")), sim.get((tokens, "bsp"))
            rel = ["-", "-"] if label == "bsp" or not bsp_e or not bsp_s else \
                [f"{emu[key] / bsp_e:.2f}", f"{sim[key] / bsp_s:.2f}"]
            lines.append(f"| {what} | {tokens} | {label} | {emu[key]:.1f} | {sim[key]:.1f} | {r:.2f} | {verdict(r)} | "
                         + " | ".join(rel) + " |")
            summary.append({"case": case, "tokens": tokens, "label": label, "measured_us": emu[key],
                            "predicted_us": sim[key], "predicted_over_measured": r})
    hits = sum(1 for s in summary if verdict(s["predicted_over_measured"]) == "yes")
    lines += ["", f"{hits} of {len(summary)} MoE cases within ±{GOAL:.0%}."]
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    print("\n".join(lines))
    if check and (missing or not summary):
        sys.exit("calibrate_report.py --check: no counterpart for " + (", ".join(missing) or "any MoE case"))
    if check and unfaithful:
        sys.exit("calibrate_report.py --check: the platform does not reproduce its link: " + "; ".join(unfaithful))


if __name__ == "__main__":
    main()
