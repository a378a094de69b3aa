#!/usr/bin/env python3
"""The README's last section, "Running across nodes", is docs/MULTINODE.md with every heading one level
deeper (code blocks untouched). Usage: readme_sync.py [--check]; --check exits 1 when they differ."""
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARK = "## Running across nodes\n"


def demoted(text):
    out, code = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            code = not code
        elif not code and line.startswith("#"):
            line = "#" + line
        out.append(line)
    return "".join(out)


def main():
    readme = (ROOT / "README.md").read_text()
    if MARK not in readme:
        sys.exit(f"readme_sync: README.md has no line {MARK.strip()!r}")
    want = readme[: readme.index(MARK)] + demoted((ROOT / "docs" / "MULTINODE.md").read_text())
    if want == readme:
        return
    if "--check" in sys.argv[1:]:
        sys.exit("readme_sync: README.md 'Running across nodes' differs from docs/MULTINODE.md "
                 "(run scripts/readme_sync.py)")
    (ROOT / "README.md").write_text(want)


if __name__ == "__main__":
    main()
