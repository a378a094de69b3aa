#!/usr/bin/env python3
"""Medians of the fault tests' "fault_result" lines, one row per case, for docs/reliability/faults.md.

  ctest --test-dir build -L faults -V --repeat until-fail:3 > faults.log
  python3 tests/faults/summarize.py faults.log [more logs...]

Columns: the case, how many runs, the median time from the fault to the first survivor's ubep error
(survivor_s), and to the end of the job (detect_s), with their ranges, the exit statuses and who ended it.
"""
import collections
import re
import statistics
import sys


def main(paths):
    runs = collections.defaultdict(list)
    for path in paths:
        with open(path, errors="replace") as f:
            for line in f:
                m = re.search(r"fault_result (.*?) env=(.*?) emulate=(\S+)", line)
                if not m:
                    continue
                kv = dict(x.split("=", 1) for x in m.group(1).split() if "=" in x)
                key = (kv["fault"], kv["point"], kv["np"], kv["launch"], m.group(2), m.group(3))
                runs[key].append(kv)
    print("| fault | point | np | launch | env | nodes | runs | ubep error after (s) | job end after (s) | rc | ended by |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(runs):
        v = runs[key]

        def med(name):
            xs = [float(r[name]) for r in v if float(r[name]) >= 0]
            if not xs:
                return "-"
            return "%.2f (%.2f-%.2f)" % (statistics.median(xs), min(xs), max(xs))

        rcs = ",".join(sorted({r["rc"] for r in v}))
        who = ",".join(sorted({r["detector"] for r in v}))
        fault, point, np, launch, env, nodes = key
        print(f"| {fault} | {point} | {np} | {launch} | {env or '-'} | {nodes if nodes != '0' else '-'} | {len(v)} |"
              f" {med('survivor_s')} | {med('detect_s')} | {rcs} | {who} |")


if __name__ == "__main__":
    main(sys.argv[1:])
