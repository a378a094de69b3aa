#!/usr/bin/env python3
"""Fails (exit 1, one line per link) when a relative link in README.md or docs/ points nowhere: a file that
does not exist, or an anchor (#...) that no heading of the target page produces (GitHub's rule: lower case,
punctuation other than '-' and '_' dropped, spaces to '-', repeats numbered -1, -2, ...)."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINK = re.compile(r'(?<!!)\[[^\]]*\]\(([^)\s]+)\)')


def anchors(page):
    seen, out = {}, set()
    fence = False
    for line in page.read_text(encoding='utf-8').splitlines():
        if line.startswith('```'):
            fence = not fence
        m = None if fence else re.match(r'^#{1,6} (.*)', line)
        if not m:
            continue
        slug = re.sub(r'[^\w\- ]', '', m.group(1).strip().lower()).replace(' ', '-')
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f'{slug}-{n}')
    return out


def check(page):
    bad = []
    fence = False
    for no, line in enumerate(page.read_text(encoding='utf-8').splitlines(), 1):
        if line.startswith('```'):
            fence = not fence
        if fence:
            continue
        for target in LINK.findall(re.sub(r'`[^`]*`', '', line)):
            if re.match(r'^[a-z][a-z0-9+.-]*:', target):  # http:, https:, mailto: ...
                continue
            path, _, anchor = target.partition('#')
            dest = (page.parent / path).resolve() if path else page
            where = f'{page.relative_to(ROOT)}:{no}: {target}'
            if not dest.exists():
                bad.append(f'{where}: no such file')
            elif anchor and dest.suffix == '.md' and anchor not in anchors(dest):
                bad.append(f'{where}: no heading makes the anchor #{anchor}')
    return bad


def main():
    pages = [ROOT / 'README.md'] + sorted((ROOT / 'docs').rglob('*.md'))
    bad = [b for p in pages for b in check(p)]
    for b in bad:
        print(b)
    print(f'{len(pages)} pages, {len(bad)} broken link(s)')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
