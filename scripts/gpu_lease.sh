#!/usr/bin/env bash
# One device command for a short lease (about 15 minutes of device time in
# all): scripts/gpu_check.sh with a lighter bench, then scripts/gpu_serve.sh
# at 16 rows and at 1 row per request with one repeat, then the PyTorch
# reference if time is left. Sized to end within LEASE_S seconds (default
# 440) so that a second command still fits the lease. SERVE=0 skips the
# service sweeps; CHECK_S bounds the check (default 230).
#
# The device tool brings back at most 8 files, so everything goes into
# $OUT/lease.tar.gz, with the summaries beside it for a first look.
set -u
FINAL=${OUT:-./gpu-out}
mkdir -p "$FINAL"
W=$(mktemp -d)
START=$(date +%s)
LEASE_S=${LEASE_S:-440}
left() { echo $((LEASE_S - ($(date +%s) - START))); }

export BENCH_ARGS=${BENCH_ARGS:---repeat 3 --pairs 1 --budget 6}
OUT=$W/check REFERENCE=${REFERENCE:-0} timeout "${CHECK_S:-230}" bash scripts/gpu_check.sh >"$W/check.log" 2>&1
echo "check rc=$? at $(( $(date +%s) - START )) s"

for rows in 16 1; do
  [ "${SERVE:-1}" = 0 ] && break
  budget=$(( $(left) / 2 - 10 ))
  [ "$rows" = 1 ] && budget=$(( $(left) - 40 ))
  [ "$budget" -lt 40 ] && { echo "serve $rows rows: skipped, ${budget}s left"; continue; }
  OUT=$W/serve$rows ROWS=$rows REPEATS=1 SECONDS_PER_PROBE=1 SWEEP_TIMEOUT=$budget \
    SWEEP_ARGS="--start-rate 400 --refine 3 --warmup-rate 400 --warmup-requests 400" \
    bash scripts/gpu_serve.sh >"$W/serve$rows.log" 2>&1
  echo "serve $rows rows rc=$? at $(( $(date +%s) - START )) s"
done

if [ "${REFERENCE:-0}" = 0 ] && [ "$(left)" -gt 45 ] && python3 -c 'import torch' 2>/dev/null; then
  . scripts/cuda_env.sh
  PYTHONUNBUFFERED=1 timeout $(( $(left) - 15 )) python3 scripts/gpu_reference.py \
    >"$W/check/reference.json" 2>"$W/reference.txt"
  echo "reference rc=$? at $(( $(date +%s) - START )) s"
fi

tar -czf "$FINAL/lease.tar.gz" -C "$W" .
cp "$W/check/summary.txt" "$FINAL/" 2>/dev/null
for rows in 16 1; do cp "$W/serve$rows/serve-sweep-gpu.md" "$FINAL/serve-sweep-gpu-${rows}rows.md" 2>/dev/null; done
cat "$W/check/summary.txt" 2>/dev/null | head -70
for rows in 16 1; do sed -n '/^## Result/,/^## Commands/p' "$W/serve$rows/serve-sweep-gpu.md" 2>/dev/null; done
echo "lease script done at $(( $(date +%s) - START )) s"
