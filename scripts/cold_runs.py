#!/usr/bin/env python3
"""Cold runs on fresh profiles: the distribution of imbalance and E.

    python3 scripts/cold_runs.py [RUNS] [-- extra coexec run args]

Each run gets an empty profile directory, so each starts from the cold probe.
E = ideal_s / makespan_s of the run (1 = every device busy to the end).
Prints min, p5, median of E, the largest imbalance and how many runs were
above 0.10; exits 1 if any was.
"""
import json
import os
import subprocess
import sys
import tempfile

runs = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "--" else 200
extra = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
exe = os.environ.get("COEXEC", "target/release/coexec")
args = extra or ["synthetic", "--devices", "cpu:1,sim:1@2", "--size", "200000"]
E, imb = [], []
for i in range(runs):
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run(
            [exe, "run", *args, "--json", "--profile-dir", d],
            capture_output=True, text=True, timeout=120,
        )
        if out.returncode != 0:
            sys.exit(f"run {i}: exit {out.returncode}: {out.stderr.strip()}")
        r = json.loads(out.stdout)["runs"][-1]
        E.append(r["ideal_s"] / r["makespan_s"])
        imb.append(r["imbalance"])
E.sort()
pct = lambda p: E[min(len(E) - 1, int(p * len(E)))]
bad = sum(x > 0.10 for x in imb)
print(f"{runs} cold runs of coexec run {' '.join(args)}")
print(f"E: min {E[0]:.3f}  p5 {pct(0.05):.3f}  median {pct(0.5):.3f}  max {E[-1]:.3f}")
print(f"imbalance: max {max(imb):.3f}; runs above 0.10: {bad}")
sys.exit(1 if bad else 0)
