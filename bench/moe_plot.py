#!/usr/bin/env python3
"""Plots, or checks, the JSON output of ubep_moe_bench (the MoE dispatch/combine benchmark).

Plot: dispatch+combine latency against tokens per rank, one line per implementation (ubep once per
schedule and combine mode, and per route when the run has several), one panel per routing (uniform,
skewed), and below each the ratio ubep/bsp.
  mpirun -np 4 ./build/bench/ubep_moe_bench --tokens 32,64,128,256,512,1024,2048 --json moe.json
  /usr/bin/python3 bench/moe_plot.py moe.json -o moe.png [--metric layer] [--compute 0]
"dispatch+combine latency" is layer_us of the cases without expert compute (the whole call, end to end);
--metric dispatch/combine/layer/sum picks another column, --compute another compute cost. Needs
matplotlib (Debian: python3-matplotlib; call /usr/bin/python3 if a pyenv python3 comes first).

Check (the bench-smoke tests; needs no matplotlib):
  moe_plot.py --check [--ranks 4] [--schedules linear,shifted,topology] [--routes mpi] [--nodes 2]
              [--ubep-routes mpi,ucx] [--combine per_expert,per_rank,per_node] -- mpirun -np 4 ./ubep_moe_bench ...
runs the command with `--json FILE` appended and fails (exit 1) unless it exits 0, prints the header, one
row per record plus the ubep/bsp ratio rows, one off-node bytes line per case and the summary, and the
JSON has, for every combination of tokens x routing x compute, exactly one bsp record and one ubep record
per route, schedule and combine mode (--combine, default the JSON's own list), with positive finite
latencies and buffer sizes and whole, non-negative byte counts (mean <= max). The byte counts must agree
with what the modes promise: ubep per_expert moves exactly BSP's bytes (every column, mean and max), no
mode sends more off the node than per_expert, per_node no more than per_rank, and on one node nothing goes
off the node and per_node moves exactly per_rank's bytes. --routes/--nodes compare the routes used (by
any rank, over all ubep routes) and the node count, --ubep-routes the routes ubep was timed over (the
record labels, and one summary line each when there are several). It then draws the plot into a
temporary file when matplotlib is available.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

FIELDS = ("impl", "label", "route", "schedule", "combine", "routing", "tokens", "hidden", "topk", "experts", "ranks",
          "dtype", "memory", "compute_us_per_token", "dispatch_us", "combine_us", "layer_us", "buffer_bytes", "bytes_per_call",
          "floor_bytes", "floor_us", "layer_over_floor")
BYTE_KEYS = ("dispatch_on_node", "dispatch_off_node", "combine_on_node", "combine_off_node")
BYTE_CELL = re.compile(r"^[0-9]+(\.[0-9]+)?/[0-9]+(\.[0-9]+)?(B|KiB|MiB|GiB)$")
METRICS = {
    "layer": ("layer_us", "dispatch + combine latency (us)"),
    "dispatch": ("dispatch_us", "dispatch (us)"),
    "combine": ("combine_us", "combine (us)"),
    "sum": (None, "dispatch_us + combine_us (us)"),
}


def load(path):
    with open(path) as f:
        doc = json.load(f)
    if doc.get("benchmark") != "ubep_moe_bench" or "results" not in doc:
        sys.exit(f"moe_plot.py: {path} is not the JSON of ubep_moe_bench")
    return doc


def value(rec, metric):
    key = METRICS[metric][0]
    return rec["dispatch_us"] + rec["combine_us"] if key is None else rec[key]


def label(rec, routes):
    if rec["impl"] == "bsp":
        return "bsp (MPI_Alltoallv)"
    combine = rec.get("combine", "per_expert")
    return (f"ubep ({rec['route']}, {rec['schedule']}, {combine})" if len(routes) > 1 else
            f"ubep ({rec['schedule']}, {combine})")


def ubep_routes(results):
    return sorted({r["route"] for r in results if r["impl"] == "ubep"})


def plot(doc, output, metric, compute, title):
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    results = doc["results"]
    computes = sorted({r["compute_us_per_token"] for r in results})
    if compute is None:
        compute = computes[0]
    results = [r for r in results if r["compute_us_per_token"] == compute]
    if not results:
        sys.exit(f"moe_plot.py: no records with compute_us_per_token = {compute} (have {computes})")
    routings = [r for r in ("uniform", "skewed") if any(x["routing"] == r for x in results)]
    routings += sorted({x["routing"] for x in results} - set(routings))
    fig, axes = plt.subplots(2, len(routings), figsize=(6.5 * len(routings), 7.5), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1.3]}, sharex="col")
    ylabel = METRICS[metric][1]
    if metric == "layer" and compute > 0:
        ylabel = f"layer time incl. {compute:g} us/token compute (us)"
    for col, routing in enumerate(routings):
        ax, rax = axes[0][col], axes[1][col]
        recs = [r for r in results if r["routing"] == routing]
        routes = ubep_routes(results)
        lines = sorted({label(r, routes) for r in recs}, key=lambda s: (not s.startswith("bsp"), s))
        bsp = {r["tokens"]: value(r, metric) for r in recs if r["impl"] == "bsp"}
        for name in lines:
            pts = sorted((r["tokens"], value(r, metric)) for r in recs if label(r, routes) == name)
            style = {"linestyle": "--", "color": "black"} if name.startswith("bsp") else {}
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name, **style)
            if not name.startswith("bsp"):
                ratio = [(t, v / bsp[t]) for t, v in pts if t in bsp and bsp[t] > 0]
                rax.plot([p[0] for p in ratio], [p[1] for p in ratio], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{routing} routing")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        rax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        rax.set_xscale("log", base=2)
        rax.set_xlabel("tokens per rank")
        rax.set_ylabel("ubep / bsp")
        rax.grid(True, which="both", alpha=0.3)
        ticks = sorted({r["tokens"] for r in recs})
        rax.set_xticks(ticks)
        rax.set_xticklabels([str(t) for t in ticks])
    r0 = results[0]
    fig.suptitle(title or (f"ubep MoE dispatch/combine: {doc.get('ranks')} ranks, {doc.get('nodes', '?')} node(s), "
                           f"hidden {r0['hidden']} {r0['dtype']}, top-{r0['topk']} of {r0['experts']} experts "
                           f"(median of max over ranks)"), fontsize=10)
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)


def fail(msg):
    print(f"moe_plot.py --check: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def check(args, command):
    if not command:
        fail("no command given after --")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "moe.json")
        proc = subprocess.run(command + ["--json", path], stdout=subprocess.PIPE, text=True)
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            fail(f"the benchmark exited with status {proc.returncode}")
        if not os.path.exists(path):
            fail("the benchmark wrote no JSON")
        doc = load(path)
        check_doc(doc, args)
        check_text(proc.stdout, doc)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("moe_plot.py --check: matplotlib not available, plot not tried")
        else:
            png = os.path.join(tmp, "moe.png")
            plot(doc, png, "layer", None, None)
            if os.path.getsize(png) == 0:
                fail("the plot is empty")
    print(f"moe_plot.py --check: OK ({len(doc['results'])} records)")


def check_doc(doc, args):
    for key in ("ubep_version", "mpi_library", "ranks", "nodes", "routes", "settings", "results", "summary",
                "kernels", "copy_bandwidth"):
        if key not in doc:
            fail(f"JSON lacks '{key}'")
    if doc["kernels"] not in ("portable", "avx2", "avx512"):
        fail(f"unknown row kernels {doc['kernels']!r}")
    bw = doc["copy_bandwidth"].get("bytes_per_us_per_rank")
    if not isinstance(bw, (int, float)) or not math.isfinite(bw) or bw <= 0:
        fail(f"copy_bandwidth.bytes_per_us_per_rank = {bw!r}, expected a positive number")
    if args.ranks is not None and doc["ranks"] != args.ranks:
        fail(f"expected {args.ranks} ranks, JSON says {doc['ranks']}")
    if args.nodes is not None and doc["nodes"] != args.nodes:
        fail(f"expected {args.nodes} nodes, JSON says {doc['nodes']}")
    if args.routes is not None and sorted(doc["routes"]) != sorted(args.routes.split(",")):
        fail(f"expected routes {args.routes}, JSON says {doc['routes']}")
    results = doc["results"]
    if not results:
        fail("no results")
    if args.memory is not None and doc.get("memory") != args.memory:
        fail(f"expected memory {args.memory}, JSON says {doc.get('memory')!r}")
    for rec in results:
        for field in FIELDS:
            if field not in rec:
                fail(f"record {rec} lacks '{field}'")
        for field in ("dispatch_us", "combine_us", "layer_us", "floor_us", "layer_over_floor"):
            v = rec[field]
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                fail(f"{field} = {v!r} in {rec}, expected a positive number")
        if not isinstance(rec["floor_bytes"], int) or rec["floor_bytes"] <= 0:
            fail(f"floor_bytes = {rec['floor_bytes']!r} in {rec}, expected a positive byte count")
        if not math.isclose(rec["layer_over_floor"], rec["layer_us"] / rec["floor_us"], rel_tol=1e-6):
            fail(f"layer_over_floor {rec['layer_over_floor']!r} is not layer_us / floor_us in {rec}")
        if not rec["buffer_bytes"] > 0:
            fail(f"buffer_bytes = {rec['buffer_bytes']!r} in {rec}")
        if rec["memory"] != doc.get("memory"):
            fail(f"record says memory {rec['memory']!r}, the header {doc.get('memory')!r}")
        if rec["ranks"] != doc["ranks"]:
            fail(f"record says {rec['ranks']} ranks, the header {doc['ranks']}")
        if rec["impl"] not in ("ubep", "bsp"):
            fail(f"unknown impl {rec['impl']!r}")
    keys = lambda r: (r["tokens"], r["routing"], r["compute_us_per_token"])  # noqa: E731
    cases = sorted({keys(r) for r in results})
    tokens = {c[0] for c in cases}
    routings = {c[1] for c in cases}
    computes = {c[2] for c in cases}
    if len(cases) != len(tokens) * len(routings) * len(computes):
        fail(f"cases {cases} are not every combination of tokens x routing x compute")
    routes = ubep_routes(results)
    if args.ubep_routes is not None and routes != sorted(args.ubep_routes.split(",")):
        fail(f"ubep was timed over the routes {routes}, expected {sorted(args.ubep_routes.split(','))}")
    if sorted(r["route"] for r in doc.get("ubep_routes", [])) != routes:
        fail(f"the JSON's ubep_routes {doc.get('ubep_routes')} do not match the records' routes {routes}")
    schedules = args.schedules.split(",") if args.schedules else None
    modes = args.combine.split(",") if args.combine else doc.get("combine")
    if not modes or doc.get("combine") != modes:
        fail(f"the JSON's combine modes {doc.get('combine')!r}, expected {modes!r}")
    if "job_traffic" not in doc or len(doc["job_traffic"].get("per_rank", [])) != doc["ranks"]:
        fail("the JSON lacks job_traffic with one record per rank")
    for case in cases:
        recs = [r for r in results if keys(r) == case]
        bsp = [r for r in recs if r["impl"] == "bsp"]
        ubep = [r for r in recs if r["impl"] == "ubep"]
        if len(bsp) != 1:
            fail(f"case {case}: {len(bsp)} bsp records, expected 1")
        for route in routes:
            per_schedule = {}
            for r in ubep:
                if r["route"] == route:
                    per_schedule.setdefault(r["schedule"], []).append(r["combine"])
            have = sorted(per_schedule)
            if schedules is not None and have != sorted(schedules):
                fail(f"case {case}, route {route}: ubep schedules {have}, expected {sorted(schedules)}")
            if not have:
                fail(f"case {case}, route {route}: no ubep record")
            for schedule, got in per_schedule.items():
                if sorted(got) != sorted(modes):
                    fail(f"case {case}, route {route}, schedule {schedule}: combine modes {got}, expected {modes}")
        check_bytes(case, bsp[0], ubep, doc["nodes"])


def check_bytes(case, bsp, ubep, nodes):
    """The byte counts of one case: well formed, and as the combine modes promise (see the module doc)."""
    def cols(rec, stat):
        b = rec["bytes_per_call"][stat]
        return [b[k] for k in BYTE_KEYS]

    for rec in [bsp] + ubep:
        for stat in ("mean", "max"):
            for k in BYTE_KEYS:
                v = rec["bytes_per_call"].get(stat, {}).get(k)
                if not isinstance(v, int) or v < 0:
                    fail(f"case {case}, {rec['label']}: bytes_per_call.{stat}.{k} = {v!r}, "
                         "expected a whole number >= 0")
        if any(m > x for m, x in zip(cols(rec, "mean"), cols(rec, "max"))):
            fail(f"case {case}, {rec['label']}: a mean over ranks above the maximum: {rec['bytes_per_call']}")
        if nodes == 1 and (cols(rec, "max")[1] or cols(rec, "max")[3]):
            fail(f"case {case}, {rec['label']}: off-node bytes on one node: {rec['bytes_per_call']}")
    if sum(cols(bsp, "mean")) == 0:
        fail(f"case {case}: bsp moved no bytes")
    def off(rec):
        return rec["bytes_per_call"]["mean"]["dispatch_off_node"] + rec["bytes_per_call"]["mean"]["combine_off_node"]

    for u in ubep:
        same = cols(u, "mean") == cols(bsp, "mean") and cols(u, "max") == cols(bsp, "max")
        if u["combine"] == "per_expert" and not same:
            fail(f"case {case}, {u['label']}: per_expert bytes {u['bytes_per_call']} differ from bsp's "
                 f"{bsp['bytes_per_call']} (both move one copy per (token, expert))")
        if off(u) > off(bsp):
            fail(f"case {case}, {u['label']}: {off(u)} off-node bytes, more than bsp's {off(bsp)}")
        if u["combine"] == "per_node":
            for v in ubep:
                if v["combine"] == "per_rank" and v["route"] == u["route"] and v["schedule"] == u["schedule"]:
                    if off(u) > off(v):
                        fail(f"case {case}, {u['label']}: {off(u)} off-node bytes, more than per_rank's {off(v)}")
                    if nodes == 1 and (cols(u, "mean") != cols(v, "mean") or cols(u, "max") != cols(v, "max")):
                        fail(f"case {case}, {u['label']}: on one node per_node moved {u['bytes_per_call']}, "
                             f"per_rank {v['bytes_per_call']}")


def check_text(text, doc):
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# ubep MoE dispatch/combine benchmark"):
        fail("the output does not start with the benchmark's header line")
    if not any(line.startswith("# tokens") and "dispatch_us" in line for line in lines):
        fail("no column line ('# tokens ... dispatch_us ...')")
    if not any(line.startswith("# UBEP paper:") for line in lines) or not any(
            line.startswith("# here:") for line in lines):
        fail("no summary next to the paper's figures")
    titles = [line for line in lines if line.startswith("# tokens") and "dispatch_us" in line][0].split()[1:]
    if titles[-5:] != ["disp_on", "disp_off", "comb_on", "comb_off", "floor_us"] or titles[10] != "combine":
        fail(f"unexpected column titles {titles}")
    rows = [line.split() for line in lines if line.strip() and not line.startswith("#")]
    if any(len(r) != 20 for r in rows):
        fail("table rows of an unexpected shape")
    data = [r for r in rows if r[7] in ("ubep", "bsp")]
    ratios = [r for r in rows if r[7] == "ubep/bsp"]
    if len(rows) != len(data) + len(ratios):
        fail("table rows of an unexpected shape")
    if len(data) != len(doc["results"]):
        fail(f"{len(data)} table rows, {len(doc['results'])} JSON records")
    if sorted((r[7], r[8], r[9], r[10]) for r in data) != sorted((r["impl"], r["route"], r["schedule"], r["combine"])
                                                                 for r in doc["results"]):
        fail("the table's (impl, route, schedule, combine) cells differ from the JSON records'")
    for r in data:
        if not all(BYTE_CELL.match(c) for c in r[15:19]):
            fail(f"row {r}: byte cells are not mean/max<unit>")
        if not re.match(r"^[0-9]+\.[0-9]$", r[19]) or float(r[19]) <= 0:
            fail(f"row {r}: floor_us {r[19]!r} is not a positive number")
    for r in ratios:
        for c in r[15:19]:
            if c != "-" and not re.match(r"^[0-9]+\.[0-9]{3}$", c):
                fail(f"ratio row {r}: byte ratio {c!r}")
        if not re.match(r"^[0-9]+\.[0-9]{3}$", r[19]) or float(r[19]) <= 0:
            fail(f"ratio row {r}: ubep/floor {r[19]!r} is not a positive ratio")
    if not any(line.startswith("# floor_us: ") for line in lines):
        fail("no header line saying how floor_us is computed")
    if len(ratios) != sum(1 for r in doc["results"] if r["impl"] == "ubep"):
        fail("not one ubep/bsp ratio row per ubep record")
    cases = sum(1 for r in doc["results"] if r["impl"] == "bsp")
    if sum(1 for line in lines if line.startswith("# off-node bytes per call ubep/bsp")) != cases:
        fail("not one off-node bytes line per case")
    routes = ubep_routes(doc["results"])
    if len(routes) > 1:
        for route in routes:
            if not any(line.startswith(f"# route {route}: layer time ubep/bsp") for line in lines):
                fail(f"no summary line for route {route}")


def main():
    argv = sys.argv[1:]
    command = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", nargs="?", help="JSON written by ubep_moe_bench --json FILE")
    p.add_argument("-o", "--output", help="PNG to write (default: the JSON file with .png)")
    p.add_argument("--metric", choices=sorted(METRICS), default="layer",
                   help="value plotted (default layer: the whole call, i.e. dispatch+combine without compute)")
    p.add_argument("--compute", type=float, help="compute_us_per_token of the cases plotted (default: the smallest)")
    p.add_argument("--title", help="plot title")
    p.add_argument("--check", action="store_true", help="run the command after -- and check its output")
    p.add_argument("--ranks", type=int, help="--check: expected number of ranks")
    p.add_argument("--nodes", type=int, help="--check: expected number of nodes")
    p.add_argument("--routes", help="--check: expected routes used, e.g. mpi or self,shm")
    p.add_argument("--ubep-routes", help="--check: expected routes ubep was timed over, e.g. mpi,ucx")
    p.add_argument("--schedules", help="--check: expected ubep schedules, e.g. linear,shifted,topology")
    p.add_argument("--combine", help="--check: expected ubep combine modes, e.g. per_expert,per_rank,per_node")
    p.add_argument("--memory", help="--check: expected --memory (host, device) of the JSON and every record")
    args = p.parse_args(argv)
    if args.check:
        check(args, command)
        return
    if not args.json:
        p.error("a JSON file is needed (or --check -- COMMAND)")
    output = args.output or os.path.splitext(args.json)[0] + ".png"
    plot(load(args.json), output, args.metric, args.compute, args.title)
    print(f"moe_plot.py: wrote {output}")


if __name__ == "__main__":
    main()
