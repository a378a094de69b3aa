#!/usr/bin/env python3
"""Smoke check of one ubep benchmark run: shape and correctness of its output, never its speed.

Usage: check_output.py --impls ubep,mpi_rma --metric latency_us [--route mpi] [--ubep-routes mpi,ucx]
                       [--max-size 4096] [--csv] [--memory device] -- mpirun -np 2 ./ubep_put_latency ...

Runs the command with `--json FILE` appended, and fails (exit 1) unless
  - the command exits 0 (a benchmark exits non-zero when a payload check fails);
  - the JSON names the benchmark, the ubep and MPI versions, 2 ranks, a known default route (the expected
    one with --route), the routes ubep was timed over (with --ubep-routes: exactly that set, or
    `default`: the default route alone), the UBEP_* settings, and with --memory the memory of the run (device:
    with the GPU heap described);
  - the sizes double from 0 or 1 up to --max-size, and every size has exactly one record per implementation
    in --impls (for ubep: one per route), with a positive finite value (raw_shm may be null only when
    marked unavailable);
  - the text table on stdout ("# " header lines, a "# Size" line, or with --csv a "Size,..." line) has one
    row per size with a value in every column, and one ubep column per route ("ubep(...)" for one route,
    "ubep_<route>(...)" for each of several) with a number in every row.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

ROUTES = {"self", "shm", "mpi", "ucx"}


def fail(msg):
    print(f"check_output: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def expected_sizes(smallest, max_size):
    sizes = [0] if smallest == 0 else []
    s = 1
    while s <= max_size:
        sizes.append(s)
        s *= 2
    return sizes


def check_json(doc, args):
    for key in ("benchmark", "ubep_version", "mpi_library", "route", "settings", "results", "batches"):
        if key not in doc:
            fail(f"JSON lacks '{key}'")
    if doc.get("ranks") != 2:
        fail(f"expected 2 ranks, JSON says {doc.get('ranks')}")
    if doc["route"] not in ROUTES:
        fail(f"unknown route {doc['route']!r}")
    if args.route != "any" and doc["route"] != args.route:
        fail(f"expected the {args.route} route, the benchmark used {doc['route']}")
    if "UBEP_TRANSPORTS" not in doc["settings"]:
        fail("the settings lack UBEP_TRANSPORTS")
    if args.memory != "any" and doc.get("memory") != args.memory:
        fail(f"expected --memory {args.memory}, the JSON says {doc.get('memory')!r}")
    if args.memory == "device" and "GPU" not in doc.get("gpu_heap", ""):
        fail(f"--memory device without a GPU heap description: {doc.get('gpu_heap')!r}")
    routes = doc.get("routes")
    if not isinstance(routes, list) or not routes or len(set(routes)) != len(routes) or set(routes) - ROUTES:
        fail(f"bad list of ubep routes {routes!r}")
    if doc["route"] not in routes:
        fail(f"the default route {doc['route']} is not among the ubep routes {routes}")
    if args.ubep_routes == "default" and routes != [doc["route"]]:
        fail(f"expected ubep over the default route {doc['route']} alone, it ran over {routes}")
    if args.ubep_routes not in ("any", "default") and sorted(routes) != sorted(args.ubep_routes.split(",")):
        fail(f"expected ubep over the routes {args.ubep_routes}, it ran over {routes}")
    impls = args.impls.split(",")
    results = doc["results"]
    if not results:
        fail("no results")
    sizes = sorted({r["size"] for r in results})
    if sizes != expected_sizes(sizes[0], args.max_size) or sizes[0] not in (0, 1):
        fail(f"sizes {sizes} do not double from 0 or 1 up to {args.max_size}")
    for size in sizes:
        for impl in impls:
            recs = [r for r in results if r["size"] == size and r["impl"] == impl]
            if impl == "ubep":
                if sorted(r.get("route") for r in recs) != sorted(routes):
                    fail(f"size {size}: ubep records for routes {[r.get('route') for r in recs]}, "
                         f"expected one per route of {routes}")
            elif len(recs) != 1:
                fail(f"size {size}: {len(recs)} records for {impl}, expected 1")
            for rec in recs:
                check_record(rec, size, impl, args)
    extra = {r["impl"] for r in results} - set(impls)
    if extra:
        fail(f"unexpected implementations {sorted(extra)}")
    return sizes, routes


def check_record(rec, size, impl, args):
    value = rec.get(args.metric)
    if rec.get("route") not in ROUTES:
        fail(f"size {size}, {impl}: bad route {rec.get('route')!r}")
    if value is None:
        if impl == "raw_shm" and rec.get("available") is False:
            return
        fail(f"size {size}, {impl}: no {args.metric}")
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        fail(f"size {size}, {impl}: {args.metric} = {value!r}, expected a positive number")
    if not rec.get("iterations", 0) > 0:
        fail(f"size {size}, {impl}: no iteration count")


def check_table(text, sizes, routes, ncols, args, name):
    lines = [l for l in text.splitlines() if l.strip()]
    header = [l for l in lines if l.startswith("#")]
    if not header or not header[0].startswith(f"# {name}:"):
        fail(f"the first header line does not name {name}: {header[:1]}")
    if not any(l.startswith("# ubep ") and "MPI library:" in l for l in header):
        fail("no '# ubep <version>; MPI library: ...' header line")
    if not any("UBEP_TRANSPORTS=" in l for l in header):
        fail("the header does not list the UBEP_* settings")
    body = [l for l in lines if not l.startswith("#")]
    if args.csv:
        if not body or not body[0].startswith("Size,"):
            fail("CSV output lacks its 'Size,...' column line")
        columns = body[0].split(",")
        rows = [l.split(",") for l in body[1:]]
    else:
        titles = [l for l in header if l.startswith("# Size")]
        if len(titles) != 1:
            fail("the table lacks its '# Size' column line")
        columns = titles[0][2:].split()
        rows = [l.split() for l in body]
    if len(columns) < 1 + ncols:
        fail(f"{len(columns)} columns, expected at least {1 + ncols}")
    if [int(r[0]) for r in rows] != sizes:
        fail(f"table rows {[r[0] for r in rows]} do not match the sizes {sizes}")
    # The ubep value columns: "ubep(unit)" for one route, "ubep_<route>(unit)" per route for several.
    prefixes = ["ubep("] if len(routes) == 1 else [f"ubep_{route}(" for route in routes]
    # (Ratio titles such as "ubep/create" or "ubep_ucx/MPI" have no unit in parentheses.)
    ubep = [i for i, c in enumerate(columns) if c.startswith("ubep") and "(" in c and "/" not in c.split("(")[0]]
    if sorted(columns[i].split("(")[0] + "(" for i in ubep) != sorted(prefixes):
        fail(f"ubep columns {[columns[i] for i in ubep]}, expected one per route: {[p + '...)' for p in prefixes]}")
    for r in rows:
        if len(r) != len(columns):
            fail(f"row {r} has {len(r)} fields, expected {len(columns)}")
        for i, cell in enumerate(r[1:], start=1):
            if cell == "n/a" and i not in ubep:
                continue
            try:
                value = float(cell)
            except ValueError:
                fail(f"row {r}: {columns[i]} = {cell!r} is not a number")
            if not value > 0:
                fail(f"row {r}: value {cell} is not positive")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impls", required=True)
    p.add_argument("--metric", required=True)
    p.add_argument("--route", default="any", help="the expected default route (the header's)")
    p.add_argument("--ubep-routes", default="any",
                   help="the routes ubep must be timed over: a list (e.g. mpi,ucx), or default (the default alone)")
    p.add_argument("--max-size", type=int, default=4096)
    p.add_argument("--csv", action="store_true")
    p.add_argument("--memory", default="any", help="the expected --memory of the run (host, device)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        fail("no command given")
    name = os.path.basename(next((c for c in cmd if os.path.basename(c).startswith("ubep_")), "ubep_"))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        proc = subprocess.run(cmd + ["--json", out], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sys.stdout.write(proc.stdout)
        sys.stderr.write(proc.stderr)
        if proc.returncode != 0:
            fail(f"the benchmark exited with {proc.returncode}")
        try:
            with open(out) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            fail(f"cannot read the JSON output: {e}")
    if doc["benchmark"] != name:
        fail(f"JSON names benchmark {doc['benchmark']!r}, ran {name!r}")
    sizes, routes = check_json(doc, args)
    check_table(proc.stdout, sizes, routes, len(args.impls.split(",")), args, name)
    print(f"check_output: OK: {name}, {len(sizes)} sizes x {args.impls}, default route {doc['route']}, "
          f"ubep over {','.join(routes)}")


if __name__ == "__main__":
    main()
