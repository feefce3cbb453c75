#!/usr/bin/env python3
"""Derives the virtual-time machine of the H100 lease (2026-11-23) from its
committed traces and bench figures: the calibration the scheduler's
virtual-time tests replay (actors/src/vtime/).

    python3 scripts/vt_calibrate.py > actors/src/vtime/h100-2026-11-23.json

Sources (docs/results/):
  gpu-h100-2026-11-23-run4/bench.json   T alone per class and T per policy,
                                        medians of 3 (kmeans, pathfinder, nbody)
  gpu-h100-2026-11-23-run4/results.txt  matmul's one cold run per policy
  gpu-h100-2026-11-23-diag/chunks-run2.txt  per-chunk traces (worker, start
                                        offset in its run, duration, phase,
                                        items) of hybrid runs

Per workload, what is derived and how (every number below comes from those
files; none is typed in):
  runs, items      items of one run and the bench's item total
  cpu.b            items/s per worker: items / (workers * (T_cpu/runs - start))
  cpu.a            fixed seconds per chunk: intercept of a least-squares line
                   through the traced CPU chunks (duration against items), >= 0
  cpu.workers      each worker's time over its chunk group's median, its
                   median over the traced groups, scaled to a mean of 1
  cpu.start        the mean CPU worker's first chunk start in a run (median
                   over traced runs 1.. in which every worker shows; else the
                   first worker's)
  cpu.spread       the spread of those first starts (their standard deviation)
  cpu.cv           chunk-to-chunk noise: the median coefficient of variation
                   of CPU chunks of equal size, phase and run (where a trace
                   lists none, the other workloads' median: the same cores)
  gpu.stage        per-run setup before a stream's first chunk: the median
                   first GPU chunk start over traced runs 1.. (run 0 compiles;
                   a one-run job, matmul, has none: 0)
  gpu.a            fixed seconds per chunk: the median time of traced GPU
                   chunks of at most 1% of a fill (0 where none was traced)
  gpu.rate         the device's items/s, both streams together (they share
                   its SMs): items / (T_gpu/runs - stage - a)
  gpu.min_work     a chunk costs at least the work of this many items: where
                   the smallest traced chunk took longer than a plus its
                   items' work (nbody: one long kernel per item on few SMs)
  gpu.cv           the coefficient of variation of the GPU-alone job times
  gpu.slowdown     per traced hybrid run (1..), the GPU's busy span over what
                   its chunks take alone (>= 1; none traced: [1]): the model
                   draws one per run and slows the GPU's work by it while a
                   CPU worker of the job runs
  gpu.capacity     items that occupy the device: 132 SMs * 1024 threads over
                   the kernel's threads per item (matmul: 7*7 tiles of 256);
                   gpu.fill is that, at most a run's items
  measured         T per class alone, T* and T per policy, E of hybrid
"""
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RES = ROOT / "docs" / "results"
BENCH = RES / "gpu-h100-2026-11-23-run4" / "bench.json"
RESULTS = RES / "gpu-h100-2026-11-23-run4" / "results.txt"
TRACE = RES / "gpu-h100-2026-11-23-diag" / "chunks-run2.txt"

CPU_WORKERS = 15  # coexec's default there: 16 cores less one per GPU
GPU_STREAMS = 2
SMS, THREADS_PER_SM = 132, 1024
THREADS_PER_ITEM = {"matmul": 7 * 7 * 256}  # one 16x16 block per tile of 100x100
GPU_TIDS = range(CPU_WORKERS, CPU_WORKERS + GPU_STREAMS)


def parse_trace(path):
    """{workload: [run, ...]}, a run being {"run": n, "chunks": [(tid, start_s, dur_s, phase, items)]}."""
    out = defaultdict(list)
    name, run = None, None
    for line in path.read_text().splitlines():
        m = re.match(r"== (\w+)-(\w+)\.json", line)
        if m:
            name = m.group(1) if m.group(2).isdigit() else None
            run = None
            continue
        m = re.match(r" RUN (\d+) dur", line)
        if m and name:
            n = int(m.group(1))
            # Each run is printed once (matmul's one run twice: keep the first).
            if any(r["run"] == n for r in out[name][-4:]) and name == "matmul":
                run = None
                continue
            run = {"run": n, "chunks": [], "cpu_first": None}
            out[name].append(run)
            continue
        m = re.match(r"  cpu chunks \d+ items \d+ first start \+([\d.]+)", line)
        if m and run is not None:
            run["cpu_first"] = float(m.group(1)) / 1e3
            continue
        m = re.match(r"  tid (\d+) \+([\d.]+) ms dur ([\d.]+) (\w+) (\d+)", line)
        if m and run is not None:
            tid, start, dur, phase, items = m.groups()
            run["chunks"].append((int(tid), float(start) / 1e3, float(dur) / 1e3, phase, int(items)))
    return out


def fit_line(points):
    """Least-squares (intercept, slope) of secs against items."""
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if sxx == 0:
        return 0.0, my / mx
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx
    return my - slope * mx, slope


def cpu_params(runs, items, t_cpu_run, fallback_cv):
    chunks = [c for r in runs for c in r["chunks"] if c[0] not in GPU_TIDS]
    a = max(fit_line([(c[4], c[2]) for c in chunks])[0], 0.0) if chunks else 0.0
    starts, spreads = [], []
    for r in runs:
        if r["run"] == 0:
            continue
        first = {}
        for tid, start, *_ in r["chunks"]:
            if tid not in GPU_TIDS:
                first[tid] = min(first.get(tid, start), start)
        if len(first) == CPU_WORKERS:
            starts.append(statistics.mean(first.values()))
            spreads.append(statistics.pstdev(first.values()))
    if starts:
        start, spread = statistics.median(starts), statistics.median(spreads)
    else:
        # No run lists every CPU chunk (matmul's runs are long): the first
        # worker's start, with no spread.
        start = statistics.median(r["cpu_first"] for r in runs if r["cpu_first"] is not None)
        spread = 0.0
    groups = defaultdict(list)
    for i, r in enumerate(runs):
        for tid, _, dur, phase, n in r["chunks"]:
            if tid not in GPU_TIDS:
                groups[(i, phase, n)].append(dur)
    cvs = [statistics.pstdev(v) / statistics.mean(v) for v in groups.values() if len(v) >= 3]
    b = items / (CPU_WORKERS * (t_cpu_run - start))
    # Workers are not alike (two share a core where hyperthreads pair up):
    # each worker's chunks against the median of their group, its median,
    # scaled to a mean of 1 (1 for all where no group was traced).
    per = defaultdict(list)
    for i, r in enumerate(runs):
        group = defaultdict(list)
        for tid, _, dur, phase, n in r["chunks"]:
            if tid not in GPU_TIDS:
                group[(phase, n)].append((tid, dur))
        for g in group.values():
            if len(g) >= 3:
                med = statistics.median(d for _, d in g)
                for tid, d in g:
                    per[tid].append(d / med)
    factors = [statistics.median(per[t]) if per.get(t) else 1.0 for t in range(CPU_WORKERS)]
    mean = statistics.mean(factors)
    factors = [round(f / mean, 4) for f in factors]
    return {
        "workers": CPU_WORKERS,
        "a_s": a,
        "b_per_worker": b,
        "start_s": start,
        "start_spread_s": spread,
        "noise_cv": statistics.median(cvs) if cvs else fallback_cv,
        "worker_factors": factors,
        "evidence": {"chunks": len(chunks), "runs_with_every_worker": len(starts), "cv_groups": len(cvs)},
    }


def gpu_params(name, runs, items, t_gpu_run, gpu_alone_runs):
    stages = []
    for r in runs:
        g = [c for c in r["chunks"] if c[0] in GPU_TIDS]
        if r["run"] > 0 and g:
            stages.append(min(c[1] for c in g))
    # One-run jobs (matmul) show only run 0, whose first chunk waits for the
    # compile: no per-run setup is measured, and their chunks are all there is.
    stage = statistics.median(stages) if stages else 0.0
    gchunks = [c for r in runs for c in r["chunks"] if c[0] in GPU_TIDS and (r["run"] > 0 or not stages)]
    capacity = max(1, -(-SMS * THREADS_PER_SM // THREADS_PER_ITEM.get(name, 1)))
    fill = min(items, capacity)
    # Chunks of at most 1% of a fill do next to no work: their time is the
    # fixed cost. Where none was traced (nbody's and matmul's smallest chunks
    # are bound by their work), it is 0.
    tiny = [c[2] for c in gchunks if c[4] <= max(1, fill // 100)]
    a = statistics.median(tiny) if tiny else 0.0
    rate = items / max(t_gpu_run - stage - a, 1e-9)
    # A chunk below a fill can cost as much as a larger one (a long kernel
    # per item runs on few SMs: nbody): the items whose work at the device's
    # rate equals the smallest traced chunk's time less the fixed cost.
    small = min(gchunks, key=lambda c: c[4])
    min_work = min(fill, max(small[4], round((small[2] - a) * rate)))
    cv = statistics.pstdev(gpu_alone_runs) / statistics.mean(gpu_alone_runs) if len(gpu_alone_runs) > 1 else 0.0
    # Co-executing, the GPU went slower than alone: 15 CPU workers and two
    # stream threads share 16 cores and the memory bus, and a stream's host
    # work (staging, launches, waits) waits for a core. Per traced hybrid
    # run: the GPU's busy span over what its chunks take at the alone rate
    # (at least 1).
    slowdown = []
    for r in runs:
        g = [c for c in r["chunks"] if c[0] in GPU_TIDS]
        if r["run"] == 0 or not g:
            continue
        span = max(c[1] + c[2] for c in g) - min(c[1] for c in g)
        alone = sum(max(c[4], min_work) for c in g) / rate + a * len(g) / GPU_STREAMS
        slowdown.append(round(max(1.0, span / alone), 4))
    return {
        "streams": GPU_STREAMS,
        "fill_items": fill,
        "capacity_items": capacity,
        "a_s": a,
        "min_work_items": min_work,
        "device_items_per_s": rate,
        "stage_s": stage,
        "noise_cv": cv,
        "coexec_slowdown": slowdown or [1.0],
        "evidence": {"chunks": len(gchunks), "runs": len(stages), "tiny_chunks": len(tiny),
                     "smallest_chunk": {"items": small[4], "secs": small[2]}},
    }


def main():
    bench = json.loads(BENCH.read_text())
    traces = parse_trace(TRACE)
    out = []
    by_name = {w["name"]: w for rep in bench for w in rep["workloads"]}
    # matmul: its bench did not fit the lease; one cold run per policy.
    mm = {}
    for line in RESULTS.read_text().splitlines():
        m = re.match(r"# matmul ([\w-]+): (\d+) run\(s\), makespans summed ([\d.]+) s", line)
        if m:
            mm[m.group(1)] = float(m.group(3))
    # A workload whose trace shows no CPU chunks of equal size takes the
    # others' median noise: the same cores.
    cvs = []
    for name in ["kmeans", "pathfinder", "nbody"]:
        groups = defaultdict(list)
        for i, r in enumerate(traces[name]):
            for tid, _, dur, phase, n in r["chunks"]:
                if tid not in GPU_TIDS:
                    groups[(i, phase, n)].append(dur)
        cvs += [statistics.pstdev(v) / statistics.mean(v) for v in groups.values() if len(v) >= 3]
    fallback_cv = statistics.median(cvs)
    for name in ["matmul", "kmeans", "pathfinder", "nbody"]:
        if name == "matmul":
            items, runs = 30000, 1
            t_cpu, t_gpu = mm["cpu-only"], mm["accel-only"]
            policies = {"hybrid": mm["hybrid"], "cpu-only": mm["cpu-only"], "accel-only": mm["accel-only"]}
            gpu_runs, cpu_predicted = [], False
            source = f"{RESULTS.relative_to(ROOT)} (one cold run per policy)"
        else:
            w = by_name[name]
            items = w["items"]
            total = w["policies"][0]["classes"][0]["items"] + w["policies"][0]["classes"][1]["items"]
            runs = round(total / items)
            alone = {a["class"]: a for a in w["alone"]}
            t_cpu, t_gpu = alone["cpu"]["median_s"], alone["cuda:0"]["median_s"]
            cpu_predicted = alone["cpu"]["predicted"]
            gpu_runs = alone["cuda:0"]["runs_s"]
            policies = {p["policy"]: p["makespan_s"] for p in w["policies"]}
            source = f"{BENCH.relative_to(ROOT)} (medians of 3)"
        tr = traces[name]
        # matmul's traces are of 60000 products: the shapes hold, the sizes scale.
        cpu = cpu_params(tr, items, t_cpu / runs, fallback_cv)
        gpu = gpu_params(name, tr, items, t_gpu / runs, gpu_runs)
        t_star = 1.0 / (1.0 / t_cpu + 1.0 / t_gpu)
        out.append({
            "name": name,
            "items": items,
            "runs": runs,
            "cpu": cpu,
            "gpu": gpu,
            "measured": {
                "source": source,
                "t_cpu_s": t_cpu,
                "t_cpu_predicted": cpu_predicted,
                "t_gpu_s": t_gpu,
                "t_star_s": t_star,
                "policies_s": policies,
                "e_hybrid": t_star / policies["hybrid"],
            },
        })
    doc = {
        "about": "The H100 lease of 2026-11-23 as a virtual machine: 15 CPU workers and one GPU of two streams. Derived, not typed: see scripts/vt_calibrate.py.",
        "derived_by": "python3 scripts/vt_calibrate.py",
        "sources": [str(p.relative_to(ROOT)) for p in (BENCH, RESULTS, TRACE)],
        "workloads": out,
    }
    json.dump(doc, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
