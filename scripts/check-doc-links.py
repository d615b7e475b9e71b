#!/usr/bin/env python3
"""Checks the links of the docs (docs/src/**/*.md) and of README.md: every relative link
points at a file that exists, every #anchor at a heading of its page, and every page of
docs/src is listed in SUMMARY.md. Exits 1 with one line per broken link.

Usage: scripts/check-doc-links.py"""
import os, re, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "docs", "src")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")

def slug(heading):
    # mdBook's and GitHub's anchor: lower case, punctuation dropped, spaces to dashes.
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")

def anchors(path):
    out, code = set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            code = not code
        elif not code and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out

def text_outside_code(path):
    out, code = [], False
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.startswith("```"):
            code = not code
        elif not code:
            out.append((n, re.sub(r"`[^`]*`", "", line)))
    return out

def main():
    pages = [os.path.join(d, f) for d, _, fs in os.walk(SRC) for f in fs if f.endswith(".md")]
    bad = []
    for page in pages + [os.path.join(ROOT, "README.md")]:
        for n, line in text_outside_code(page):
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue  # http(s), mailto: not checked offline
                path, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
                where = f"{os.path.relpath(page, ROOT)}:{n}: {target}"
                if not os.path.exists(dest):
                    bad.append(f"{where}: no such file")
                elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                    bad.append(f"{where}: no heading #{anchor}")
    summary = open(os.path.join(SRC, "SUMMARY.md"), encoding="utf-8").read()
    listed = {os.path.normpath(os.path.join(SRC, t)) for t in LINK.findall(summary)}
    for p in pages:
        if os.path.basename(p) != "SUMMARY.md" and os.path.normpath(p) not in listed:
            bad.append(f"{os.path.relpath(p, ROOT)}: not in docs/src/SUMMARY.md")
    for b in bad:
        print(b)
    print(f"check-doc-links: {len(pages)} pages, {len(bad)} broken")
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())
