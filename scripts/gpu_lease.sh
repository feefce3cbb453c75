#!/usr/bin/env bash
# One device command for a short lease (about 15 minutes of device time in
# all, a machine's start included), ending within LEASE_S seconds. STEPS
# names what it runs, in order; each step gets what is left of LEASE_S at
# most, so a slow step costs the ones after it, never the whole command.
#
#   check      scripts/gpu_check.sh (CHECK_S at most, default 230) with a
#              lighter bench; with `oracle` also in STEPS, without its bench
#              (the oracle's rows are a superset) or mandelbrot's growth
#   serve      scripts/gpu_serve.sh at 16 rows, then 1 row per request, one
#              repeat each
#   reference  scripts/gpu_reference.py (PyTorch ceilings) if 45 s are left
#   oracle     scripts/gpu_oracle.sh: `coexec bench --oracle` on the four
#              workloads and kmeans at --points 4000000 (ORACLE_S at most,
#              default 270: a workload gets a sixth, the large kmeans two)
#   telemetry  scripts/gpu_telemetry.sh (about 20 s)
#   memory     scripts/gpu_memory.sh (needs 100 s left; its runs' timeouts
#              shrink to fit)
#
# Defaults: STEPS="check serve reference", LEASE_S=440 (a second command
# still fits the lease). The open issues' GPU items in one command:
#   STEPS="check oracle telemetry memory" LEASE_S=560
# (under a 600 s call).
#
# The device tool brings back at most 8 files, so everything goes into
# $OUT/lease.tar.gz, with the summaries beside it for a first look.
set -u
FINAL=${OUT:-./gpu-out}
mkdir -p "$FINAL"
W=$(mktemp -d)
START=$(date +%s)
LEASE_S=${LEASE_S:-440}
STEPS=" ${STEPS:-check serve reference} "
left() { echo $((LEASE_S - ($(date +%s) - START))); }
has() { case $STEPS in *" $1 "*) return 0 ;; esac; return 1; }
at() { echo "$1 at $(( $(date +%s) - START )) s"; }

for step in $STEPS; do
  case $step in
  check)
    budget=${CHECK_S:-230}
    [ "$budget" -gt "$(left)" ] && budget=$(left)
    bench=1 mandel=${MANDEL_ARGS:-8192 2000 5}
    has oracle && bench=0 mandel=${MANDEL_ARGS:-8192 2000 3}
    OUT=$W/check REFERENCE=${REFERENCE:-0} BENCH=$bench MANDEL_ARGS=$mandel \
      BENCH_ARGS=${BENCH_ARGS:---repeat 3 --pairs 1 --budget 6} \
      timeout "$budget" bash scripts/gpu_check.sh >"$W/check.log" 2>&1
    at "check rc=$?"
    ;;
  serve)
    for rows in 16 1; do
      budget=$(( $(left) / 2 - 10 ))
      [ "$rows" = 1 ] && budget=$(( $(left) - 40 ))
      [ "$budget" -lt 40 ] && { echo "serve $rows rows: skipped, ${budget}s left"; continue; }
      OUT=$W/serve$rows ROWS=$rows REPEATS=1 SECONDS_PER_PROBE=1 SWEEP_TIMEOUT=$budget \
        SWEEP_ARGS="--start-rate 400 --refine 3 --warmup-rate 400 --warmup-requests 400" \
        bash scripts/gpu_serve.sh >"$W/serve$rows.log" 2>&1
      at "serve $rows rows rc=$?"
    done
    ;;
  reference)
    if [ "${REFERENCE:-0}" = 0 ] && [ "$(left)" -gt 45 ] && python3 -c 'import torch' 2>/dev/null; then
      . scripts/cuda_env.sh
      mkdir -p "$W/check"
      PYTHONUNBUFFERED=1 timeout $(( $(left) - 15 )) python3 scripts/gpu_reference.py \
        >"$W/check/reference.json" 2>"$W/reference.txt"
      at "reference rc=$?"
    fi
    ;;
  oracle)
    budget=${ORACLE_S:-270}
    [ "$budget" -gt "$(( $(left) - 10 ))" ] && budget=$(( $(left) - 10 ))
    [ "$budget" -lt 60 ] && { echo "oracle: skipped, $(left)s left"; continue; }
    OUT=$W/oracle T=${T:-$((budget / 6))} timeout "$budget" bash scripts/gpu_oracle.sh >"$W/oracle.log" 2>&1
    at "oracle rc=$?"
    ;;
  telemetry)
    [ "$(left)" -lt 40 ] && { echo "telemetry: skipped, $(left)s left"; continue; }
    OUT=$W/telemetry timeout 35 bash scripts/gpu_telemetry.sh >"$W/telemetry.log" 2>&1
    at "telemetry rc=$?"
    ;;
  memory)
    budget=$(( $(left) - 5 ))
    [ "$budget" -lt 100 ] && { echo "memory: skipped, $(left)s left"; continue; }
    OUT=$W/memory RUN_S=$(( (budget - 30) / 3 )) timeout "$budget" bash scripts/gpu_memory.sh >"$W/memory.log" 2>&1
    at "memory rc=$?"
    ;;
  *) echo "unknown step $step (check serve reference oracle telemetry memory)" ;;
  esac
done

tar -czf "$FINAL/lease.tar.gz" -C "$W" .
cp "$W/check/summary.txt" "$FINAL/" 2>/dev/null
for rows in 16 1; do cp "$W/serve$rows/serve-sweep-gpu.md" "$FINAL/serve-sweep-gpu-${rows}rows.md" 2>/dev/null; done
for f in oracle/oracle.txt telemetry/gpu-telemetry.txt memory/gpu-memory.txt; do cp "$W/$f" "$FINAL/" 2>/dev/null; done
head -70 "$W/check/summary.txt" 2>/dev/null
for rows in 16 1; do sed -n '/^## Result/,/^## Commands/p' "$W/serve$rows/serve-sweep-gpu.md" 2>/dev/null; done
tail -40 "$W/oracle.log" 2>/dev/null
grep -E '^==|coexec_gpu_(utilization|memory_used)' "$W/telemetry/gpu-telemetry.txt" 2>/dev/null | head -12
grep -vE '^\s*[{}\[\]]' "$W/memory/gpu-memory.txt" 2>/dev/null | head -30
at "lease script done"
