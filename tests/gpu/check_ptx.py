#!/usr/bin/env python3
"""build.ptx_signal_orderings: the PTX of transports/cuda/signal_kernels.cu shows the orderings its header promises.

  check_ptx.py FILE.ptx              check the file
  check_ptx.py --self-test FILE.ptx  the file must pass, and each mutation of it below must fail

Per kernel (.entry), in the order of its instructions in the file (nvcc lays a kernel's blocks out in program
order here: no loop runs back over a store of another phase):
  put_signal_kernel  every plain store (the block's copy) before bar.sync; after bar.sync no plain store at
                     all; fence.sc.sys after bar.sync and before each signal update: st.release.sys (set) and
                     atom.add.release.sys (add)
  signal_op_kernel   fence.sc.sys before st.release.sys and atom.add.release.sys; no plain store
  wait_until_kernel  every load that is not a parameter is ld.acquire.sys, polled with nanosleep against
                     %globaltimer (the deadline); the status is published with st.release.sys, after every
                     plain store (the value seen, the time waited)
Anywhere: no memory operation or fence at a narrower scope (.cta, .gpu), and no relaxed signal store.
Exit 0 when all hold, 1 with one line per failure.
"""
import re
import sys

KERNELS = ("put_signal_kernel", "signal_op_kernel", "wait_until_kernel")
PLAIN_STORE = r"^st\.(global\.|shared\.|local\.)?(v[24]\.)?[usbf]\d+\s"
RELEASE = r"^(st\.release\.sys\.b64|atom\.add\.release\.sys\.u64)"


def entries(ptx):
    """{kernel name: [instruction lines]} for every .entry of the file."""
    out = {}
    for m in re.finditer(r"\.entry\s+(\S+?)\s*\((.*?)\n\}", ptx, re.S):
        name = m.group(1)
        short = re.search("(" + "|".join(KERNELS) + ")", name)
        lines = [l.strip() for l in m.group(2).splitlines()]
        out[short.group(1) if short else name] = [l for l in lines if l and not l.startswith("//")]
    return out


def where(lines, pattern):
    return [i for i, l in enumerate(lines) if re.search(pattern, l)]


def check(ptx):
    """The failures of one PTX text (empty: it holds)."""
    kernels = entries(ptx)
    failures = []

    def lines_of(kernel):
        lines = kernels.get(kernel)
        if lines is None:
            failures.append(f"{kernel}: not in the PTX")
        return lines or []

    def need(kernel, pattern, what):
        at = where(lines_of(kernel), pattern)
        if kernel in kernels and not at:
            failures.append(f"{kernel}: no {what}")
        return at

    def before(kernel, first, first_what, then, then_what):
        """Every instruction of `first` comes before every one of `then`."""
        if first and then and max(first) > min(then):
            failures.append(f"{kernel}: {first_what} after {then_what}: {kernels[kernel][max(first)]}")

    k = "put_signal_kernel"
    bar = need(k, r"^bar\.sync", "bar.sync (the block's copy before the signal)")
    fence = need(k, r"^fence\.sc\.sys", "fence.sc.sys")
    need(k, r"^st\.release\.sys\.b64", "st.release.sys (set)")
    need(k, r"^atom\.add\.release\.sys\.u64", "atom.add.release.sys (add)")
    release = where(lines_of(k), RELEASE)
    stores = need(k, PLAIN_STORE, "plain store (the block's copy)")
    before(k, stores, "a plain store (the copy)", bar, "bar.sync")
    before(k, bar, "bar.sync", fence, "fence.sc.sys")
    before(k, fence, "fence.sc.sys", release, "a release of the signal")
    before(k, stores, "a plain store (the copy)", release, "a release of the signal")

    k = "signal_op_kernel"
    fence = need(k, r"^fence\.sc\.sys", "fence.sc.sys")
    need(k, r"^st\.release\.sys\.b64", "st.release.sys (set)")
    need(k, r"^atom\.add\.release\.sys\.u64", "atom.add.release.sys (add)")
    before(k, fence, "fence.sc.sys", where(lines_of(k), RELEASE), "a release of the signal")
    for i in where(lines_of(k), PLAIN_STORE):
        failures.append(f"{k}: a plain store: {kernels[k][i]}")

    k = "wait_until_kernel"
    need(k, r"^ld\.acquire\.sys\.b64", "ld.acquire.sys (the poll)")
    need(k, r"%globaltimer", "%globaltimer (the deadline)")
    need(k, r"^nanosleep", "nanosleep (the back-off)")
    status = need(k, r"^st\.release\.sys\.b64", "st.release.sys (the status)")
    before(k, where(lines_of(k), PLAIN_STORE), "a plain store of the status fields", status,
           "the status's release")
    for l in kernels.get(k, []):
        if re.match(r"ld\.", l) and not re.match(r"ld\.(param|acquire\.sys)", l):
            failures.append(f"{k}: a load that is not an acquire at system scope: {l}")

    for kernel, lines in kernels.items():
        for l in lines:
            if re.match(r"(ld|st|atom|red|fence|membar)\.", l) and re.search(r"\.(cta|gpu|cluster)\b", l):
                failures.append(f"{kernel}: narrower than system scope: {l}")
            if re.match(r"(st|atom|red)\.relaxed", l):
                failures.append(f"{kernel}: a relaxed update: {l}")
    return failures


def edit_kernel(ptx, kernel, edit):
    """ptx with the body of `kernel` replaced by edit(lines) (a list of its raw lines)."""
    m = re.search(r"(\.entry\s+\S*" + kernel + r"\S*?\s*\()(.*?)(\n\})", ptx, re.S)
    body = m.group(2).split("\n")
    return ptx[: m.start(2)] + "\n".join(edit(body)) + ptx[m.end(2):]


def move(pattern, to_after=None, to_before=None):
    """An edit moving the first line matching `pattern` after the last line matching `to_after`, or before the
    first matching `to_before`."""

    def edit(lines):
        src = next(i for i, l in enumerate(lines) if re.search(pattern, l.strip()))
        line = lines.pop(src)
        if to_after is not None:
            at = max(i for i, l in enumerate(lines) if re.search(to_after, l.strip())) + 1
        else:
            at = min(i for i, l in enumerate(lines) if re.search(to_before, l.strip()))
        lines.insert(at, line)
        return lines

    return edit


def drop(pattern):
    return lambda lines: [l for l in lines if not re.search(pattern, l.strip())]


# Each mutation is a bug the check must catch. The first two passed the check of the first positions alone.
MUTATIONS = [
    ("the copy after the signal (a data store moved behind the release)", "put_signal_kernel",
     move(r"^st\.global\.v4", to_after=r"^st\.release\.sys")),
    ("the wait status written after its release", "wait_until_kernel",
     move(r"^st\.release\.sys", to_before=r"^st\.global")),
    ("no barrier before the signal", "put_signal_kernel", drop(r"^bar\.sync")),
    ("no fence before the signal", "signal_op_kernel", drop(r"^fence\.sc\.sys")),
    ("the fence before the barrier", "put_signal_kernel", move(r"^fence\.sc\.sys", to_before=r"^bar\.sync")),
    ("a relaxed set", "signal_op_kernel",
     lambda lines: [l.replace("st.release.sys.b64", "st.relaxed.sys.b64") for l in lines]),
    ("a plain poll", "wait_until_kernel",
     lambda lines: [l.replace("ld.acquire.sys.b64", "ld.global.u64") for l in lines]),
    ("a fence at gpu scope", "put_signal_kernel", lambda lines: [l.replace("fence.sc.sys", "fence.sc.gpu") for l in lines]),
]


def self_test(ptx):
    failures = [f"the unmutated PTX fails: {f}" for f in check(ptx)]
    for what, kernel, edit in MUTATIONS:
        try:
            mutated = edit_kernel(ptx, kernel, edit)
        except (AttributeError, StopIteration, ValueError) as e:
            failures.append(f"mutation '{what}' does not apply to this PTX ({e!r})")
            continue
        if mutated == ptx:
            failures.append(f"mutation '{what}' changed nothing")
        elif not check(mutated):
            failures.append(f"mutation '{what}' passes the check")
    return failures


def main():
    args = sys.argv[1:]
    test = args[:1] == ["--self-test"]
    if test:
        args = args[1:]
    if len(args) != 1:
        print("\n".join(__doc__.strip().splitlines()[2:4]))
        return 2
    ptx = open(args[0]).read()
    failures = self_test(ptx) if test else check(ptx)
    for f in failures:
        print("FAIL:", f)
    if not failures:
        if test:
            print(f"ok: the PTX passes and each of {len(MUTATIONS)} mutations fails the check")
        else:
            print(f"ok: {len(entries(ptx))} kernels, the orderings transports/cuda/signal_kernels.hpp promises")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
