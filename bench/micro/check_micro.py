#!/usr/bin/env python3
"""Smoke check of one ubep_micro_bench run: the shape of its Google Benchmark JSON, never its speed.

Usage: check_micro.py [--families P,...] FILE [-- ./ubep_micro_bench --benchmark_min_time=0.01 --benchmark_out=FILE
                                 --benchmark_out_format=json]

With a command, removes FILE, runs the command and requires exit status 0; then (with or without a
command) fails (exit 1) unless FILE
  - exists and parses as JSON, with a non-empty `benchmarks` list;
  - has at least one entry of every family, by name prefix: pack/, regroup/, reduce/, kernels/, convert/,
    schedule/, heap/ (or those given with --families, e.g. calls/,dispatch_copy/ for ubep_micro_calls);
  - has in every entry a name, a positive finite real_time, a positive iteration count, and no
    error_occurred.
"""
import argparse
import json
import math
import os
import subprocess
import sys

FAMILIES = ("pack/", "regroup/", "reduce/", "kernels/", "convert/", "schedule/", "heap/")


def fail(msg):
    print(f"check_micro: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def check(doc, families=FAMILIES):
    benchmarks = doc.get("benchmarks") if isinstance(doc, dict) else None
    if not isinstance(benchmarks, list) or not benchmarks:
        fail("the JSON has no non-empty 'benchmarks' list")
    for b in benchmarks:
        name = b.get("name")
        if not isinstance(name, str) or not name:
            fail(f"an entry has no name: {b}")
        if b.get("error_occurred"):
            fail(f"{name}: error_occurred: {b.get('error_message', '?')}")
        t = b.get("real_time")
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            fail(f"{name}: real_time = {t!r}, expected a positive number")
        if not b.get("iterations", 0) > 0:
            fail(f"{name}: no iterations")
    names = [b["name"] for b in benchmarks]
    missing = [f for f in families if not any(n.startswith(f) for n in names)]
    if missing:
        fail(f"no benchmark of the families {missing}")
    return names


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", help="the --benchmark_out file")
    p.add_argument("--families", default=",".join(FAMILIES), help="comma-separated name prefixes, each required")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if cmd:
        if os.path.exists(args.json):
            os.remove(args.json)  # a stale file must not pass for this run's
        proc = subprocess.run(cmd)
        if proc.returncode != 0:
            fail(f"the benchmark exited with {proc.returncode}")
    try:
        with open(args.json) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"cannot read {args.json}: {e}")
    families = tuple(f for f in args.families.split(",") if f)
    names = check(doc, families)
    print(f"check_micro: OK: {len(names)} benchmarks in {len(families)} families ({args.json})")


if __name__ == "__main__":
    main()
