#!/usr/bin/env python3
"""Size figures of a coexec checkout: lines per crate, the largest file and
structs, `unsafe` blocks and their SAFETY notes, integration test binaries,
and (with --doc) the public items of `coexec` with its default features.

    python3 scripts/code_size.py [--doc] [CHECKOUT]

Lines are of each crate's `src/` (unit tests included); a struct's size is
its named fields. --doc runs `cargo doc -p coexec --no-deps` in the checkout
and counts the entries of its all-items page.
"""
import argparse
import glob
import os
import re
import subprocess
import sys

CRATES = ["kernels", "actors", "runtime", "cli"]


def structs(path, text):
    """(fields, name, path) of each braced struct in `text`."""
    out = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)(pub(\([^)]*\))?\s+)?struct\s+(\w+)[^;(]*\{\s*$", line)
        if not m:
            continue
        indent, n = m.group(1), 0
        for body in lines[i + 1:]:
            if body.startswith(indent + "}"):
                break
            if re.match(r"^\s*(pub(\([^)]*\))?\s+)?\w+\s*:", body):
                n += 1
        out.append((n, m.group(4), path))
    return out


def unsafe_blocks(text):
    """(blocks, those with a SAFETY note on their line or the 16 above)."""
    lines = text.splitlines()
    total = noted = 0
    for i, line in enumerate(lines):
        if re.search(r"\bunsafe\s*\{", line.split("//")[0]):
            total += 1
            if any("SAFETY" in l for l in lines[max(0, i - 16): i + 1]):
                noted += 1
    return total, noted


def public_items(root):
    subprocess.run(["cargo", "doc", "-p", "coexec", "--no-deps", "-q"], cwd=root, check=True)
    page = open(os.path.join(root, "target", "doc", "coexec", "all.html")).read()
    return len(re.findall(r"<li><a href=", page))


def test_binaries(root):
    """Integration test targets: declared ones and auto-discovered files."""
    n = 0
    for crate in CRATES:
        toml = open(os.path.join(root, crate, "Cargo.toml")).read()
        declared = re.findall(r'path = "([^"]+)"', toml)
        n += toml.count("[[test]]")
        auto = os.path.join(root, crate, "tests")
        if os.path.isdir(auto):
            n += sum(1 for f in os.listdir(auto)
                     if f.endswith(".rs") and f"tests/{f}" not in declared)
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkout", nargs="?", default=".")
    ap.add_argument("--doc", action="store_true")
    a = ap.parse_args()
    root = os.path.abspath(a.checkout)
    biggest, found, blocks, noted = (0, ""), [], 0, 0
    for crate in CRATES:
        files = sorted(glob.glob(os.path.join(root, crate, "src", "**", "*.rs"), recursive=True))
        total = 0
        for f in files:
            text = open(f, encoding="utf-8").read()
            rel = os.path.relpath(f, root)
            total += text.count("\n")
            biggest = max(biggest, (text.count("\n"), rel))
            found += structs(rel, text)
            b, s = unsafe_blocks(text)
            blocks, noted = blocks + b, noted + s
        print(f"lines {crate}/src: {total} in {len(files)} files")
    top = sorted(found, reverse=True)[:3]
    print(f"largest file: {biggest[1]} ({biggest[0]} lines)")
    print("largest structs: " + ", ".join(f"{s} ({n} fields, {p})" for n, s, p in top))
    print(f"unsafe blocks: {blocks}, with a SAFETY note: {noted}")
    print(f"integration test binaries: {test_binaries(root)}")
    if a.doc:
        print(f"public items of coexec (default features): {public_items(root)}")


if __name__ == "__main__":
    sys.exit(main())
