#!/usr/bin/env python3
"""Where one `coexec serve` spends its cores under a fixed open-loop load.

Starts the server on a loopback port, warms it, then sends RATE requests/s
for SECONDS with `coexec-load` and prints, per thread name, the share of a
core it ran and the share it waited runnable for one (Linux
/proc/<pid>/task/*/schedstat), and the rows per second each device class
computed and its chunks per batch (from /metrics: more than one chunk per
batch in all means batches were split), and the load generator's own share
of a core. Linux only; stdlib only.

    python3 scripts/serve_threads.py --devices cpu:1,sim:1@0.5 --rate 1400
"""

import argparse
import collections
import os
import re
import resource
import subprocess
import tempfile
import time
import urllib.request

from serve_sweep import ROOT, Server


def threads(pid):
    """{thread name: [ns run, ns waiting]} summed over the threads of pid."""
    out = collections.defaultdict(lambda: [0, 0])
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                run, wait, _ = f.read().split()
        except OSError:
            continue  # the thread ended
        out[name][0] += int(run)
        out[name][1] += int(wait)
    return out


def by_class(text, metric):
    """{device class: the metric summed over its other labels} from /metrics."""
    got = collections.Counter()
    for m in re.finditer(rf'^{metric}\{{[^}}]*device_class="([^"]+)"[^}}]*\}} (\S+)$', text, re.M):
        got[m.group(1)] += float(m.group(2))
    return got


def scrape(url):
    """What /metrics says so far: ({class: items}, {class: chunks}, jobs
    completed, {class: (a s, b items/s)})."""
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    jobs = sum(float(m.group(1)) for m in
               re.finditer(r'^coexec_jobs_completed_total(?:\{[^}]*\})? (\S+)$', text, re.M))
    models = collections.defaultdict(lambda: [float("nan")] * 2)
    for m in re.finditer(r'^coexec_model_(fixed_seconds|items_per_second)\{[^}]*device_class="([^"]+)"[^}]*\} (\S+)$', text, re.M):
        models[m.group(2)][m.group(1) == "items_per_second"] = float(m.group(3))
    return by_class(text, "coexec_items_total"), by_class(text, "coexec_chunks_total"), jobs, models


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--coexec", default="target/release/coexec")
    ap.add_argument("--load", default="target/release/coexec-load")
    ap.add_argument("--devices", default="cpu:1,sim:1@0.5")
    ap.add_argument("--policy", default="hybrid", choices=["hybrid", "greedy"])
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--rows-per-request", type=int, default=16)
    ap.add_argument("serve_args", nargs="*", help="more `coexec serve` flags, after --")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        # serve_sweep's Server: started on a free loopback port, read until
        # it listens, stopped with SIGTERM.
        server = Server(
            [a.coexec, "serve", "--addr", "127.0.0.1:0", "--devices", a.devices,
             "--policy", a.policy, "--profile-dir", tmp, *a.serve_args],
            os.path.join(tmp, "server.log"), 30)
        url = server.url
        try:
            load = [a.load, "--target", url, "--rows-per-request", str(a.rows_per_request)]
            subprocess.run(load + ["--rate", "200", "--requests", "600"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, cwd=ROOT)
            t0, (i0, k0, j0, _), w0 = threads(server.pid), scrape(url), time.monotonic()
            n = int(a.rate * a.seconds)
            c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            res = subprocess.run(load + ["--rate", str(a.rate), "--requests", str(n)],
                                 capture_output=True, text=True, check=False, cwd=ROOT)
            wall = time.monotonic() - w0
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t1, (i1, k1, j1, models) = threads(server.pid), scrape(url)
        finally:
            server.terminate()
    print("\n".join(res.stdout.strip().splitlines()[-2:]))
    print(f"{a.devices} {a.policy} at {a.rate:g}/s, {wall:.2f} s of load; share of a core:")
    for name in sorted(t1):
        run = (t1[name][0] - t0.get(name, [0, 0])[0]) / 1e9 / wall
        wait = (t1[name][1] - t0.get(name, [0, 0])[1]) / 1e9 / wall
        if run > 0.005 or wait > 0.005:
            print(f"  {name:18} ran {run:6.3f}  waited for a core {wait:6.3f}")
    gen = (c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime) / wall
    print(f"  {'(coexec-load)':18} ran {gen:5.2f}")
    jobs = j1 - j0
    for c in sorted(i1):
        a_s, b = models[c]
        chunks = k1[c] - k0[c]
        print(f"  class {c}: {chunks / max(jobs, 1):.2f} chunks per batch over {jobs:,.0f} batches")
        print(f"  class {c}: {(i1[c] - i0.get(c, 0)) / wall:,.0f} rows/s; "
              f"its model at the end: {a_s * 1e3:.2f} ms per chunk + {b:,.0f} rows/s")


if __name__ == "__main__":
    main()
