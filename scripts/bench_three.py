#!/usr/bin/env python3
"""Runs the README's main job (`coexec bench`, defaults) several times in a
row and checks the bench's stability claims on what it printed (stdlib only):

- no E above 1 printed as a number (it must read "= T* within ±x%");
- each run's hybrid E lies inside every other run's E interval.

Writes OUT.md (a table per workload and run, the checks) and keeps each
run's stdout and JSON beside it as OUT-runN.txt / OUT-runN.json.

    python3 scripts/bench_three.py --out docs/results/cpu-bench-3runs
"""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time


def run_bench(coexec, out, i, extra):
    js = f"{out}-run{i}.json"
    cmd = [coexec, "bench", "--json", js, "--quiet"] + extra
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    with open(f"{out}-run{i}.txt", "w") as f:
        f.write("$ " + " ".join(cmd[1:]) + "\n" + p.stderr + p.stdout)
    if p.returncode != 0:
        sys.exit(f"run {i}: exit {p.returncode}:\n{p.stderr[-2000:]}")
    with open(js) as f:
        return json.load(f), p.stdout, wall


# An E cell printed as a bare number: "0.988 ±9.4%" (policy rows only).
E_NUMBER = re.compile(r"^\s+(\S+)\s+[\d.]+\s+±[\d.?]+%?\s+([\d.]+) ±")


# A speed-up above 1 not marked as noise: "1.051x ±12.0%" without "(noise)".
SPEEDUP = re.compile(r"([\d.]+)x ±(?:[\d.]+%|\?)(?! \(noise\))")


def gains_printed(stdout):
    """Policy rows whose E is printed as a number above 1, or whose speed-up
    above 1 is not marked as noise (every class here is the same CPU)."""
    bad = []
    for line in stdout.splitlines():
        m = E_NUMBER.match(line)
        s = SPEEDUP.search(line)
        if (m and float(m.group(2)) > 1.0) or (s and float(s.group(1)) > 1.0):
            bad.append(line.strip())
    return bad


def fmt_ci(ci):
    return "none" if not ci else f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--coexec", default="target/release/coexec")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", required=True, help="path prefix of what is written")
    ap.add_argument("extra", nargs="*", help="more bench arguments (after --)")
    a = ap.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True).stdout.strip())
    runs = [run_bench(a.coexec, a.out, i, a.extra) for i in range(1, a.runs + 1)]

    rows, per_workload, gains = [], {}, []
    for i, (d, stdout, wall) in enumerate(runs, 1):
        gains += [f"run {i}: {g}" for g in gains_printed(stdout)]
        for w in d["workloads"]:
            h = next(p for p in w["policies"] if p["policy"] == "hybrid")
            per_workload.setdefault(w["name"], []).append((i, h))
            rows.append(f"| {w['name']} | {i} | {h['makespan_s']:.3f} | {fmt_ci(h.get('ci_s'))} | "
                        f"{h['efficiency']:.3f} | {fmt_ci(h.get('efficiency_ci'))} | "
                        f"{len(h.get('runs_s') or [])} |")
    overlap, missing = [], []
    for name, hs in per_workload.items():
        for i, hi in hs:
            for j, hj in hs:
                if i == j:
                    continue
                ci = hj.get("efficiency_ci")
                if not ci:
                    missing.append(f"{name}: run {j} has no E interval")
                elif not ci[0] <= hi["efficiency"] <= ci[1]:
                    overlap.append(f"{name}: run {i}'s E {hi['efficiency']:.3f} outside run {j}'s "
                                   f"{fmt_ci(ci)}")
    missing = sorted(set(missing))
    with open(a.out + ".md", "w") as f:
        f.write(f"# `coexec bench` {a.runs} times in a row\n\n")
        f.write(f"{started:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, commit {commit}"
                f"{' (dirty)' if dirty else ''}. Made by `python3 scripts/bench_three.py "
                f"--out {a.out}`; each run: `coexec bench --json FILE --quiet` (the README's "
                f"main job, default rounds and budget). Wall time per run: "
                f"{', '.join(f'{r[2]:.0f} s' for r in runs)}.\n\n")
        f.write("Hybrid per workload, from each run's JSON (T's and E's 95% intervals; "
                "E's comes from T's and the classes' alone):\n\n")
        f.write("| workload | run | hybrid T (s) | T ±95% | E | E interval | rounds |\n")
        f.write("| --- | --- | --- | --- | --- | --- | --- |\n")
        f.write("\n".join(sorted(rows, key=lambda r: (r.split("|")[1], r.split("|")[2]))) + "\n\n")
        f.write("## Checks\n\n")
        f.write(f"- E above 1 printed as a number (a gain): "
                f"{'none' if not gains else '; '.join(gains)}\n")
        f.write(f"- every run's hybrid E inside every other run's interval: "
                f"{'yes' if not overlap and not missing else 'no'}"
                f"{''.join(chr(10) + '  - ' + o for o in overlap + missing)}\n")
        f.write(f"\nEach run's output: `{os.path.basename(a.out)}-runN.txt`, JSON "
                f"`{os.path.basename(a.out)}-runN.json`.\n")
    print(open(a.out + ".md").read())
    return 0 if not gains and not overlap and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
