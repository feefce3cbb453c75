#!/usr/bin/env python3
"""Side-by-side runs of `coexec serve` builds or settings at fixed rates.

Each configuration is a name and a server command (a template: `{profile_dir}`
becomes a fresh profile folder per run; the server must print its
`listening on` line, so give it `--addr 127.0.0.1:0`). For every round, rate
and configuration, in that order, with the configurations rotated each round
so that none always runs first: a fresh server, a warm-up, then one open-loop
`coexec-load` run; the server is stopped with SIGTERM. Prints one line per run
and a table of medians, and writes every run's command and full report as JSON
(rewritten after each run, so an interrupted comparison keeps what it ran).
Exits 1 when a run broke the service's contract: a request lost, duplicated,
malformed or crossed, or a server that did not exit 0 on SIGTERM.

    python3 scripts/serve_ab.py --rates 2900,3100 --rounds 4 --requests 9000 \\
        --config 'old=/tmp/old/coexec serve --addr 127.0.0.1:0 --devices cpu:1,sim:1@0.5 --profile-dir {profile_dir}' \\
        --config 'new=target/release/coexec serve --addr 127.0.0.1:0 --devices cpu:1,sim:1@0.5 --profile-dir {profile_dir}' \\
        --out /tmp/knee

With `--generator oha --oha PATH` the measured run is `oha` instead (an
independent open-loop generator: `-q RATE --latency-correction`, so each
latency counts from the request's scheduled time, over `--connections`
keep-alive connections); the warm-up stays with coexec-load. oha is not a
dependency of the project: `cargo install oha --locked --root /tmp/oha`.

Loopback only (coexec-load refuses anything else; the oha target is the
server's own 127.0.0.1 address); stdlib only.
"""

import argparse
import json
import math
import os
import re
import shlex
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile

from serve_sweep import ROOT, Server, die, log, machine, now_utc, run_at


def parse_config(text):
    name, sep, cmd = text.partition("=")
    if not sep or not name or not cmd.strip():
        die(f"--config wants NAME=COMMAND, got {text!r}")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        die(f"--config name {name!r}: letters, digits, '_', '.' and '-' only")
    if "{profile_dir}" not in cmd:
        die(f"--config {name}: the command has no {{profile_dir}}, so runs would share a profile")
    return name, cmd


def body_file(data, rows, out_dir):
    """A request body of the first `rows` rows of the test set's `x`
    (safetensors: an 8-byte header length, a JSON header, the raw data)."""
    with open(data, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    x = json.loads(raw[8:8 + n])["x"]
    if x["dtype"] != "F32" or len(x["shape"]) != 2:
        die(f"{data}: x is {x['dtype']} {x['shape']}, not a 2-D F32 tensor")
    features = x["shape"][1]
    lo = 8 + n + x["data_offsets"][0]
    values = struct.unpack(f"<{rows * features}f", raw[lo:lo + 4 * rows * features])
    inputs = [list(values[i * features:(i + 1) * features]) for i in range(rows)]
    path = os.path.join(out_dir, f"body-{rows}.json")
    with open(path, "w") as f:
        json.dump({"inputs": inputs}, f)
    return path


def oha_at(args, url, rate, n):
    """`n` requests at `rate` through oha; returns (argv, a report in
    coexec-load's shape for the fields this script reads)."""
    argv = [args.oha, "--no-tui", "--output-format", "json", "-n", str(n), "-q", f"{rate:g}",
            "--latency-correction", "-c", str(args.connections), "-t", f"{args.timeout:g}s",
            "-m", "POST", "-T", "application/json", "-D", args.body, url + "/v1/infer"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=n / rate + args.timeout + 30)
    if done.returncode != 0:
        die(f"oha exited {done.returncode}: {done.stderr.strip()[-500:]}")
    out = json.loads(done.stdout)
    codes = {int(k): v for k, v in out.get("statusCodeDistribution", {}).items()}
    errors = sum(out.get("errorDistribution", {}).values())
    pct = out.get("latencyPercentiles", {})
    ok = codes.get(200, 0)
    report = dict(ok=ok, status_429=codes.get(429, 0), status_503=codes.get(503, 0),
                  status_504=codes.get(504, 0),
                  lost=errors, duplicated=0, malformed=0, crossed=0,
                  latency_ok=dict(count=ok, **{f"{q}_ms": 1e3 * (pct.get(q) or math.nan)
                                               for q in ("p50", "p95", "p99")}),
                  oha=out.get("summary", {}))
    return argv, report


def one_run(args, name, cmd, rate, tag):
    profile_dir = tempfile.mkdtemp(prefix=f"coexec-ab-{tag}-")
    argv = [a.replace("{profile_dir}", profile_dir) for a in shlex.split(cmd)]
    server = Server(argv, os.path.join(args.log_dir, f"server-{tag}.log"), args.ready_timeout)
    try:
        if args.warmup_requests > 0:
            run_at(args, server.url, args.warmup_rate, args.warmup_requests)
        if args.generator == "oha":
            load_argv, report = oha_at(args, server.url, rate, args.requests)
        else:
            load_argv, report = run_at(args, server.url, rate, args.requests)
    finally:
        code = server.terminate()
        shutil.rmtree(profile_dir, ignore_errors=True)
    return dict(config=name, rate=rate, server=shlex.join(argv),
                load=shlex.join(load_argv), server_exit=code, report=report)


def broken(run):
    """What a run did against the service's contract ([] when nothing)."""
    r = run["report"]
    bad = [f"{k} {r[k]}" for k in ("lost", "duplicated", "malformed", "crossed") if r.get(k)]
    if run["server_exit"] != 0:
        bad.append(f"server exit {run['server_exit']} on SIGTERM")
    return bad


def ms(report, q):
    """A latency percentile of the 200s; NaN when there were none."""
    lat = report["latency_ok"]
    return lat[q + "_ms"] if lat.get("count") else float("nan")


def median(values):
    """The median of the values that are numbers (NaN when none is)."""
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else float("nan")


def line(run):
    r = run["report"]
    return (f"{run['config']:>10} {run['rate']:>7g}/s  200 {r['ok']:>6}  "
            f"429 {r.get('status_429', 0):>5}  503 {r['status_503']:>5}  "
            f"504 {r['status_504']:>4}  lost {r['lost']}  dup {r['duplicated']}  p50 {ms(r, 'p50'):7.2f}  "
            f"p95 {ms(r, 'p95'):7.2f}  p99 {ms(r, 'p99'):7.2f} ms")


def table(runs, names, rates):
    out = ["| rate, req/s | config | 200s per round | median 200s | median p50 / p95 / p99 of 200s, ms |",
           "| ---: | --- | --- | ---: | --- |"]
    for rate in rates:
        for name in names:
            mine = [r["report"] for r in runs if r["config"] == name and r["rate"] == rate]
            if not mine:
                continue
            oks = [r["ok"] for r in mine]
            lat = " / ".join(f"{median([ms(r, q) for r in mine]):.2f}" for q in ("p50", "p95", "p99"))
            out.append(f"| {rate:g} | {name} | {', '.join(map(str, oks))} | "
                       f"{statistics.median(oks):g} | {lat} |")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", action="append", required=True, metavar="NAME=COMMAND")
    p.add_argument("--rates", required=True, help="comma-separated requests/s")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=9000)
    p.add_argument("--rows-per-request", type=int, default=16)
    p.add_argument("--timeout", type=float, default=2.0)
    p.add_argument("--warmup-requests", type=int, default=600)
    p.add_argument("--warmup-rate", type=float, default=500.0)
    p.add_argument("--ready-timeout", type=float, default=60.0)
    p.add_argument("--load", default=os.path.join(ROOT, "target/release/coexec-load"))
    p.add_argument("--load-cpus", default=None, help="taskset the generator to these CPUs")
    p.add_argument("--data", default=os.path.join(ROOT, "examples/models/digits_test.safetensors"))
    p.add_argument("--generator", choices=["coexec-load", "oha"], default="coexec-load")
    p.add_argument("--oha", default="oha", help="the oha binary, for --generator oha")
    p.add_argument("--connections", type=int, default=64,
                   help="oha's keep-alive connections (--generator oha)")
    p.add_argument("--out", required=True, help="writes OUT.json and OUT.md")
    args = p.parse_args()

    configs = [parse_config(c) for c in args.config]
    names = [n for n, _ in configs]
    if len(set(names)) != len(names):
        die("--config names must differ")
    try:
        rates = [float(x) for x in args.rates.split(",")]
    except ValueError:
        die(f"--rates wants numbers, got {args.rates!r}")
    if args.rounds < 1 or args.requests < 1 or any(r <= 0 for r in rates):
        die("--rounds, --requests and every rate must be positive")
    if args.warmup_requests > 0 and args.warmup_rate <= 0:
        die("--warmup-rate must be positive")
    args.log_dir = tempfile.mkdtemp(prefix="coexec-ab-logs-")
    if args.generator == "oha":
        if args.connections < 1:
            die("--connections must be positive")
        args.body = body_file(args.data, args.rows_per_request, args.log_dir)
    log(f"server logs in {args.log_dir}")

    report = dict(started=now_utc(), ended=None, machine=machine(), argv=sys.argv,
                  configs=dict(configs), runs=[])

    def save():
        report["ended"] = now_utc()
        with open(args.out + ".json", "w") as f:
            json.dump(report, f, indent=1)

    failures = []
    for rnd in range(args.rounds):
        order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
        for rate in rates:
            for name, cmd in order:
                run = one_run(args, name, cmd, rate, f"{name}-{rate:g}-r{rnd + 1}")
                run["round"] = rnd + 1
                report["runs"].append(run)
                save()
                log(f"round {rnd + 1}: {line(run)}")
                failures += [f"round {rnd + 1}, {name} at {rate:g}/s: {b}" for b in broken(run)]
    md = table(report["runs"], names, rates)
    print(md)
    with open(args.out + ".md", "w") as f:
        f.write(f"Measured {report['started']} to {report['ended']} by `{shlex.join(sys.argv)}`.\n\n{md}\n")
    for f in failures:
        log(f"FAILED {f}")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
