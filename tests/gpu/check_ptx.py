#!/usr/bin/env python3
"""build.ptx_signal_orderings: the PTX of transports/cuda/signal_kernels.cu shows the orderings its header promises.

  check_ptx.py FILE.ptx

Per kernel (.entry), in the order of its instructions:
  put_signal_kernel  the block's copy, bar.sync, fence.sc.sys, then the signal: st.release.sys (set) and
                     atom.add.release.sys (add), both after the fence
  signal_op_kernel   fence.sc.sys, then st.release.sys and atom.add.release.sys
  wait_until_kernel  every load that is not a parameter is ld.acquire.sys, polled with nanosleep against
                     %globaltimer (the deadline), and the status is published with st.release.sys
Anywhere: no memory operation or fence at a narrower scope (.cta, .gpu), and no relaxed signal store.
Exit 0 when all hold, 1 with one line per failure.
"""
import re
import sys


def entries(ptx):
    """{kernel name: [instruction lines]} for every .entry of the file."""
    out = {}
    for m in re.finditer(r"\.entry\s+(\S+?)\s*\((.*?)\n\}", ptx, re.S):
        name = m.group(1)
        short = re.search(r"(put_signal_kernel|signal_op_kernel|wait_until_kernel)", name)
        lines = [l.strip() for l in m.group(2).splitlines()]
        out[short.group(1) if short else name] = [l for l in lines if l and not l.startswith("//")]
    return out


def first(lines, pattern):
    for i, l in enumerate(lines):
        if re.search(pattern, l):
            return i
    return None


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2].strip())
        return 2
    ptx = open(sys.argv[1]).read()
    kernels = entries(ptx)
    failures = []

    def need(kernel, pattern, after=None, what=None):
        lines = kernels.get(kernel)
        if lines is None:
            failures.append(f"{kernel}: not in the PTX")
            return None
        at = first(lines, pattern)
        if at is None:
            failures.append(f"{kernel}: no {what or pattern}")
        elif after is not None and after[1] is not None and at < after[1]:
            failures.append(f"{kernel}: {what or pattern} comes before {after[0]}")
        return at

    bar = need("put_signal_kernel", r"^bar\.sync", what="bar.sync (the block's copy before the signal)")
    fence = need("put_signal_kernel", r"^fence\.sc\.sys", after=("bar.sync", bar), what="fence.sc.sys")
    need("put_signal_kernel", r"^st\.release\.sys\.b64", after=("fence.sc.sys", fence), what="st.release.sys (set)")
    need("put_signal_kernel", r"^atom\.add\.release\.sys\.u64", after=("fence.sc.sys", fence),
         what="atom.add.release.sys (add)")
    fence = need("signal_op_kernel", r"^fence\.sc\.sys", what="fence.sc.sys")
    need("signal_op_kernel", r"^st\.release\.sys\.b64", after=("fence.sc.sys", fence), what="st.release.sys (set)")
    need("signal_op_kernel", r"^atom\.add\.release\.sys\.u64", after=("fence.sc.sys", fence),
         what="atom.add.release.sys (add)")
    need("wait_until_kernel", r"^ld\.acquire\.sys\.b64", what="ld.acquire.sys (the poll)")
    need("wait_until_kernel", r"%globaltimer", what="%globaltimer (the deadline)")
    need("wait_until_kernel", r"^nanosleep", what="nanosleep (the back-off)")
    need("wait_until_kernel", r"^st\.release\.sys\.b64", what="st.release.sys (the status)")
    for l in kernels.get("wait_until_kernel", []):
        if re.match(r"ld\.", l) and not re.match(r"ld\.(param|acquire\.sys)", l):
            failures.append(f"wait_until_kernel: a load that is not an acquire at system scope: {l}")
    for kernel, lines in kernels.items():
        for l in lines:
            if re.match(r"(ld|st|atom|red|fence|membar)\.", l) and re.search(r"\.(cta|gpu|cluster)\b", l):
                failures.append(f"{kernel}: narrower than system scope: {l}")
            if re.match(r"(st|atom|red)\.relaxed", l):
                failures.append(f"{kernel}: a relaxed update: {l}")
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print(f"ok: {len(kernels)} kernels, release/acquire at system scope as transports/cuda/signal_kernels.hpp says")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
