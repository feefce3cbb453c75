#!/usr/bin/env python3
"""Ratios of a latency percentile between configurations of a serve_ab.py run,
with how sure the run can be of them.

For each JSON that `serve_ab.py --out OUT` wrote, each rate and each
configuration: the median over rounds of its percentile (p99 unless told),
its ratio to the median of `--base`, and a 90% interval of that ratio from a
paired bootstrap over rounds (a resample draws whole rounds, so each
configuration keeps the conditions it met beside the others in that round;
seeded per cell, so the same rounds give the same interval). With `--goal G`, a
cell is `met` when the whole interval is at or below G, `missed` when it is
wholly above, and `unresolved` when the interval straddles G: the run could
not tell.

An A/A check is the same command under two names (`cpu` and `cpu-again`):
its ratio is 1 by construction, so how far its interval reaches is what the
machine's noise alone does to the ratio in that many rounds.

    python3 scripts/ab_ratio.py --base cpu --goal 1.1 \\
        docs/results/serve-placer-ab-final-loadgen.json

The percentiles are of the 200s only, as serve_ab.py reports them: a
configuration that refuses requests (429) is not charged for them here, so
read its 429s in serve_ab.py's table beside the ratio. A run with no 200s
has no value; a ratio uses the rounds in which both configurations have
one, the median column every round of that configuration.

Reads only; stdlib only. A file that is not serve_ab's JSON is named in a
one-line error (exit 2).
"""

import argparse
import json
import math
import random

from serve_ab import median
from serve_sweep import die

QUANTILES = ("p50", "p95", "p99")


def latency(run):
    """The run's `latency_ok` (serve_ab's report of its 200s), or None."""
    report = run.get("report")
    lat = report.get("latency_ok") if isinstance(report, dict) else None
    return lat if isinstance(lat, dict) else None


def load(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        die(f"{path}: {e.strerror}")
    except json.JSONDecodeError as e:
        die(f"{path}:{e.lineno}: not JSON ({e.msg})")
    except (ValueError, RecursionError) as e:
        die(f"{path}: not JSON ({type(e).__name__})")
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list):
        die(f"{path}: no `runs` list (not a serve_ab.py JSON)")
    for i, r in enumerate(runs):
        if not (isinstance(r, dict) and isinstance(r.get("config"), str)
                and isinstance(r.get("rate"), (int, float))
                and isinstance(r.get("round", 0), int)):
            die(f"{path}: run {i} has no `config` name, `rate` and `round` (not a serve_ab.py run)")
        lat = latency(r)
        for q in QUANTILES:
            v = lat.get(f"{q}_ms") if lat else None
            if v is not None and not isinstance(v, (int, float)):
                die(f"{path}: run {i}: latency_ok.{q}_ms is {v!r}, not a number")
    return data, runs


def percentile(run, q):
    """The run's percentile of its 200s in ms; NaN when it had none."""
    lat = latency(run)
    if lat is None:
        return math.nan
    v = lat.get(f"{q}_ms")
    return float(v) if lat.get("count") and v is not None else math.nan


def rounds_of(runs, rate, q):
    """{round: {config: value}} at `rate`."""
    out = {}
    for r in runs:
        if r.get("rate") == rate:
            out.setdefault(r.get("round", 0), {})[r["config"]] = percentile(r, q)
    return out


def paired(rounds, name, base):
    """The rounds in which both configurations ran and have a value."""
    return [r for r in rounds
            if not math.isnan(r.get(name, math.nan)) and not math.isnan(r.get(base, math.nan))]


def ratio_of_medians(rounds, name, base):
    """median(name) / median(base) over the rounds in which both have a value."""
    both = paired(rounds, name, base)
    num, den = median([r[name] for r in both]), median([r[base] for r in both])
    return num / den if den and not math.isnan(den) else math.nan


def interval(rounds, name, base, draws, seed, level=0.90):
    """The paired bootstrap interval of the ratio of medians, from a
    generator seeded with `seed` (a string: the same cell gets the same
    interval whatever else the file holds)."""
    rng = random.Random(seed)
    rounds = paired(rounds, name, base)
    if len(rounds) < 2:
        return (math.nan, math.nan)
    got = []
    for _ in range(draws):
        sample = [rng.choice(rounds) for _ in rounds]
        x = ratio_of_medians(sample, name, base)
        if not math.isnan(x):
            got.append(x)
    if not got:
        return (math.nan, math.nan)
    got.sort()
    lo = got[int((1 - level) / 2 * (len(got) - 1))]
    hi = got[int((1 + level) / 2 * (len(got) - 1))]
    return (lo, hi)


def verdict(lo, hi, goal):
    if goal is None or math.isnan(lo):
        return ""
    if hi <= goal:
        return "met"
    if lo > goal:
        return "missed"
    return "unresolved"


def report(path, base, q, goal, draws):
    data, runs = load(path)
    names = list(dict.fromkeys(r["config"] for r in runs))
    if base not in names:
        die(f"{path}: no configuration named {base!r} (it has {', '.join(names)})")
    commands = data.get("configs") if isinstance(data.get("configs"), dict) else {}
    rates = sorted({r["rate"] for r in runs})
    out = [f"`{path}`: {q} over rounds, ratio to `{base}` with its 90% paired-bootstrap "
           f"interval ({draws} resamples of the rounds)"
           + (f"; goal ≤ {goal:g}" if goal is not None else ""),
           "",
           f"| rate/s | config | rounds | median {q}, ms | per round, ms | / {base} | 90% interval |"
           + (" verdict |" if goal is not None else ""),
           "| ---: | --- | ---: | ---: | --- | ---: | --- |" + (" --- |" if goal is not None else "")]
    for rate in rates:
        by_round = rounds_of(runs, rate, q)
        rounds = [by_round[k] for k in sorted(by_round)]
        for name in names:
            mine = [r[name] for r in rounds if name in r]
            if not mine:
                continue
            row = (f"| {rate:g} | {name} | {len(mine)} | {median(mine):.2f} | "
                   f"{', '.join(f'{v:.1f}' for v in mine)} |")
            if name == base:
                out.append(row + " 1 | — |" + (" |" if goal is not None else ""))
                continue
            same = commands.get(name) is not None and commands.get(name) == commands.get(base)
            x = ratio_of_medians(rounds, name, base)
            lo, hi = interval(rounds, name, base, draws, f"{rate:g}/{name}/{base}")
            tag = " (A/A)" if same else ""
            out.append(row + f" {x:.2f}{tag} | {lo:.2f}–{hi:.2f} |"
                       + (f" {verdict(lo, hi, goal)} |" if goal is not None else ""))
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", metavar="JSON")
    p.add_argument("--base", required=True, help="the configuration the others are divided by")
    p.add_argument("--quantile", choices=QUANTILES, default="p99")
    p.add_argument("--goal", type=float, default=None, help="the ratio a configuration must stay at or below")
    p.add_argument("--draws", type=int, default=4000, help="bootstrap resamples")
    args = p.parse_args()
    if args.draws < 100:
        die("--draws must be at least 100")
    if args.goal is not None and not args.goal > 0:
        die("--goal must be positive")
    print("\n\n".join(report(f, args.base, args.quantile, args.goal, args.draws) for f in args.files))


if __name__ == "__main__":
    main()
