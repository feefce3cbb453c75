#!/usr/bin/env python3
"""Runs the same `coexec run` commands with two binaries, alternating, and
compares their results (byte for byte) and run times (medians, and the
median of the per-pair ratios). Stdlib only.

    python3 scripts/compare_runs.py --before /tmp/old/coexec \
        --after target/release/coexec --repeat 7 --out docs/results/before-after-bench

The time compared is the run's own (the `N run(s), ... T s` line: from
built inputs to the last output), not input generation, which later
versions do on every core.
"""

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile

# The sizes `coexec bench` uses.
WORKLOADS = [
    ["matmul", "--count", "20000"],
    ["kmeans"],
    ["pathfinder", "--cols", "1000000", "--rows", "1000"],
    ["nbody", "--bodies", "16384", "--steps", "10"],
]
RUN_TIME = re.compile(r"run\(s\), \d+ items each, ([\d.]+)s")
# Lines that carry times or timing-dependent detail, not results.
NOT_RESULT = re.compile(r"run\(s\)|^time:|inputs|imbalance|chunks|warning|profile|^\s*input:")


PROFILES = {}


def run(binary, args):
    # Each binary learns in its own fresh profile folder.
    if binary not in PROFILES:
        PROFILES[binary] = tempfile.mkdtemp(prefix="coexec-compare-")
    env = dict(os.environ, COEXEC_PROFILE_DIR=PROFILES[binary])
    p = subprocess.run([binary, "run"] + args, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{binary} run {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()[-500:]}")
    m = RUN_TIME.search(p.stdout)
    if not m:
        sys.exit(f"{binary} run {' '.join(args)}: no run time in:\n{p.stdout}")
    result = [l.strip() for l in p.stdout.splitlines() if l.strip() and not NOT_RESULT.search(l)]
    return float(m.group(1)), result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--devices", default="cpu:2")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--only", help="comma-separated workloads (default: all four)")
    ap.add_argument("--kmeans-file", help="kmeans input for both (else each binary's default)")
    ap.add_argument("--out", required=True, help="writes OUT.md")
    a = ap.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    lines = []
    ok = True
    for w in WORKLOADS:
        if a.only and w[0] not in a.only.split(","):
            continue
        args = w + ["--devices", a.devices]
        if w[0] == "kmeans" and a.kmeans_file:
            args += ["--file", a.kmeans_file]
        tb, ta, ratios, rb, ra = [], [], [], None, None
        for i in range(a.repeat):
            # Alternate which goes first, so drift favours neither.
            order = [("b", a.before), ("a", a.after)]
            if i % 2:
                order.reverse()
            got = {k: run(b, args) for k, b in order}
            tb.append(got["b"][0])
            ta.append(got["a"][0])
            ratios.append(got["a"][0] / got["b"][0])
            rb = rb or got["b"][1]
            ra = ra or got["a"][1]
            for k in "ab":
                if got[k][1] != (rb if k == "b" else ra):
                    ok = False
                    lines.append(f"- {w[0]}: {k} result changed between repeats")
            print(f"{w[0]} {i + 1}/{a.repeat}: before {tb[-1]:.4f} s, after {ta[-1]:.4f} s",
                  file=sys.stderr)
        same = rb == ra
        ok &= same
        lines.append(
            f"| {w[0]} | {statistics.median(tb):.4f} | {statistics.median(ta):.4f} | "
            f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f}) | "
            f"{'identical' if same else 'DIFFERENT'} | `{' / '.join(ra)[:90]}` |")
        if not same:
            lines.append(f"|  | before: `{' / '.join(rb)}` | | | | |")
    with open(a.out + ".md", "w") as f:
        f.write("# The same runs before and after\n\n")
        f.write(f"{started:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores. Before: `{a.before}`; "
                f"after: `{a.after}`. Each: `coexec run W --devices {a.devices}` at the sizes `bench` uses, "
                f"{a.repeat} times per binary, alternating, the first of each pair swapped "
                f"every repeat. Made by `python3 scripts/compare_runs.py --before BEFORE "
                f"--after AFTER --repeat {a.repeat} --out {a.out}`.\n\n")
        f.write("| workload | before T (s, median) | after T (s, median) | after/before "
                "(median of pairs, range) | results | result |\n")
        f.write("| --- | ---: | ---: | --- | --- | --- |\n")
        f.write("\n".join(lines) + "\n")
    print(open(a.out + ".md").read())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
