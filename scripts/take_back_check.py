#!/usr/bin/env python3
"""End-to-end check of the take-back: a device whose stored model says it is
far faster than it is gets most of a job, runs far past its prediction, and
its chunk is taken back and run elsewhere; the job still computes every item
exactly once.

Steps, on a fresh profile directory:
  1. a learning run of `coexec run synthetic` on DEVICES;
  2. every model of a class whose key starts with PREFIX (`cuda`, `sim`) is
     made FACTOR times faster than measured (capped below the profile's
     plausibility limit), its samples dropped;
  3. a second run, sized so that the misjudged class alone would take about
     SECONDS at its true speed (at most what the CPU class gets through in
     CPU_SECONDS, since it may end up doing the job): the misjudged class's
     first chunk runs far past its prediction. CPU_SECONDS is large enough
     that the misjudged class's chunks (its share over about eight) outlast
     the take-back's 20 ms slack on a fast GPU: with 4, an H200 ran each
     of its eleven chunks in 18 ms and none was taken back (2026-11-26).

Passes (exit 0) when the second run is verified (every item once, right
value) and counts at least one retry; prints one JSON line either way.
Runs here with a sim (`--devices cpu:1,sim:1@0.01 --prefix sim`) and on a
GPU machine with `--prefix cuda` (scripts/gpu_check.sh).
"""
import argparse
import glob
import json
import subprocess
import sys
import tempfile

SPEED_LIMIT = 1e12  # actors/src/profiler/store.rs: SPEED_RANGE's end


def fail(report):
    """The one JSON line, on stdout as on success, and exit 1."""
    print(json.dumps({"ok": False, **report}))
    sys.exit(1)


def run(args, size, profile_dir):
    cmd = [args.coexec, "run", "synthetic", "--work", str(args.work), "--size", str(size),
           "--profile-dir", profile_dir, "--quiet", "--json"]
    if args.devices:
        cmd += ["--devices", args.devices]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        fail({"cmd": cmd, "why": f"no answer within {args.timeout} s"})
    if p.returncode != 0:
        fail({"cmd": cmd, "rc": p.returncode, "stderr": p.stderr[-2000:]})
    return json.loads(p.stdout), p.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--coexec", default="target/release/coexec")
    ap.add_argument("--devices", default="", help="device spec (default: coexec's own)")
    ap.add_argument("--prefix", required=True, help="model keys of the misjudged class start so")
    ap.add_argument("--work", type=int, default=1000)
    ap.add_argument("--size", type=int, default=200_000, help="items of the learning run")
    ap.add_argument("--factor", type=float, default=1000.0)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--cpu-seconds", type=float, default=12.0)
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="coexec-take-back-") as d:
        first, _ = run(args, args.size, d)
        cpu_rate = sum(c["workers"] * (c.get("model_b_items_per_s") or 0.0)
                       for c in first["runs"][-1]["classes"] if c["name"] == "cpu")
        files = glob.glob(f"{d}/**/coexec-profile-*.json", recursive=True)
        if len(files) != 1:
            fail({"why": f"profiles found: {files}"})
        prof = json.load(open(files[0]))
        key = f"synthetic/w{args.work}"
        models = prof.get("kernels", {}).get(key, {}).get("models")
        if not models:
            fail({"why": f"no models of {key} in {files[0]}"})
        doctored = {}
        size = args.size
        for k, m in models.items():
            if not k.startswith(args.prefix):
                continue
            b = m["b"]
            fast = min(b * args.factor, SPEED_LIMIT / 10)
            models[k] = {"a": 0.0, "b": fast, "samples": [], "observed": 10}
            doctored[k] = {"measured_b": b, "stored_b": fast}
            want = b * args.seconds
            if cpu_rate > 0:
                want = min(want, cpu_rate * args.cpu_seconds)
            size = max(size, int(want))
        if not doctored:
            fail({"why": f"no model starts with {args.prefix!r}", "models": list(models)})
        json.dump(prof, open(files[0], "w"))
        out, err = run(args, size, d)
    runs = out["runs"]
    retries = sum(r["retries"] for r in runs)
    verified = out["result"].get("verified") is True
    report = {
        "ok": verified and retries >= 1,
        "verified": verified,
        "retries": retries,
        "size": size,
        "doctored": doctored,
        "makespan_s": sum(r["makespan_s"] for r in runs),
        "classes": [{k: c.get(k) for k in ("name", "items", "chunks") if k in c}
                    for c in runs[-1]["classes"]],
        "taken_back_warnings": err.count("taken back"),
    }
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
