#!/usr/bin/env bash
# The service sweep on a GPU machine: `coexec serve` with the
# digits MLP on the CPU class alone, the GPU alone, greedy and hybrid over
# both, at 16 rows per request (ROWS), p99 bound 50 ms. Run from the repository root
# with what scripts/README.md step 1 puts in .bin/ (coexec and coexec-load).
# Writes $OUT/serve-sweep-gpu.{md,json} and serve-logs.tar.gz (the servers'
# logs: the device tool brings back 8 files at most); under 9 minutes, so
# that one device command of 600 s holds it.
#
# Environment overrides:
#   CPUS      the CPU class (default cpu:8: the other cores run the HTTP
#             handlers, the GPU streams' threads and the load generator)
#   GPU       the GPU class (default cuda:0x2: two streams)
#   REPEATS   repeats of each configuration (default 2)
#   ROWS      rows per request (default 16)
#   SWEEP_ARGS  extra arguments for serve_sweep.py (e.g. --refine 2)
#   SWEEP_TIMEOUT  seconds the sweep may run (default 540)
#   SECONDS_PER_PROBE   load per probe (default 2)
set -u
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
LOGS=$(mktemp -d)
CPUS=${CPUS:-cpu:8}
GPU=${GPU:-cuda:0x2}
. scripts/cuda_env.sh
for b in .bin/coexec .bin/coexec-load; do
  [ -x "$b" ] || { echo "missing $b (build it first, see scripts/README.md)" >&2; exit 2; }
done
timeout "${SWEEP_TIMEOUT:-540}" python3 scripts/serve_sweep.py \
  --coexec .bin/coexec --load .bin/coexec-load \
  --rows-per-request "${ROWS:-16}" --repeats "${REPEATS:-2}" --probe-seconds "${SECONDS_PER_PROBE:-2}" \
  --start-rate 200 --max-rate 40000 \
  --config "cpu;$CPUS;hybrid" --config "gpu;$GPU;hybrid" \
  --config "greedy;$GPU,$CPUS;greedy" --config "hybrid;$GPU,$CPUS;hybrid" \
  --single cpu,gpu --log-dir "$LOGS" --out "$OUT/serve-sweep-gpu" ${SWEEP_ARGS:-}
rc=$?
tar -czf "$OUT/serve-logs.tar.gz" -C "$LOGS" . && rm -rf "$LOGS"
echo "serve sweep rc=$rc"
exit $rc
