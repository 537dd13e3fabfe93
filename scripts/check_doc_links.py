#!/usr/bin/env python3
"""Check the Markdown links of the user documentation.

Every link in the checked files must point inside the repository: to a file
that exists and, when it names an anchor (`FILE.md#anchor` or `#anchor`), to a
heading of that file, with GitHub's anchors (lowercase, punctuation dropped,
spaces to hyphens, `-1`, `-2` … for repeated headings). Links to web pages
are reported too: the documents must not link outside the repository.

Usage: scripts/check_doc_links.py [FILE.md …]   (default: the files below)
Exit status 0 when every link resolves, 1 otherwise.
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = ["README.md", "GUIDE.md", "docs/DESIGN.md", "docs/BENCHMARKS.md", "docs/TESTING.md"]

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`]*`")


def lines_outside_code(text):
    """The lines of a Markdown text that are not inside fenced code blocks."""
    inside = False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield line


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen = {}
        found = set()
        with open(path, encoding="utf-8") as f:
            for line in lines_outside_code(f.read()):
                m = HEADING.match(line)
                if not m:
                    continue
                base = slug(m.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        _anchors[path] = found
    return _anchors[path]


def check(rel):
    path = os.path.join(ROOT, rel)
    problems = []
    count = 0
    with open(path, encoding="utf-8") as f:
        text = f.read()
    inside = False
    for lineno, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if inside:
            continue
        for m in LINK.finditer(INLINE_CODE.sub("``", line)):
            target = m.group(1)
            count += 1
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                problems.append(f"{rel}:{lineno}: links outside the repository: {target}")
                continue
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not dest.startswith(ROOT + os.sep) and dest != ROOT:
                problems.append(f"{rel}:{lineno}: leaves the repository: {target}")
                continue
            if not os.path.exists(dest):
                problems.append(f"{rel}:{lineno}: no such file: {target}")
                continue
            if anchor:
                if not dest.endswith(".md"):
                    problems.append(f"{rel}:{lineno}: anchor into a file that is not Markdown: {target}")
                elif anchor not in anchors(dest):
                    problems.append(f"{rel}:{lineno}: no heading for #{anchor} in {os.path.relpath(dest, ROOT)}")
    return count, problems


def main(argv):
    files = argv[1:] or DEFAULT
    total = 0
    problems = []
    for rel in files:
        count, found = check(rel)
        total += count
        problems += found
    for p in problems:
        print(p)
    print(f"{total} links checked in {len(files)} files: {len(problems)} broken")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
