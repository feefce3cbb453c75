#!/usr/bin/env bash
# The service on a GPU machine: `coexec serve` with the digits MLP on the
# CPU class alone, the GPU alone, greedy and hybrid over both, at 16 rows
# per request (ROWS): each one's capacity at p99 <= 50 ms, found by
# `coexec-load --server … --capacity-p99-ms 50` (fresh server per search,
# rounds rotated). Run from the repository root with what scripts/README.md
# step 1 puts in .bin/ (coexec and coexec-load). Writes
# $OUT/serve-sweep-gpu.txt (every probe, then the table) and
# serve-logs.tar.gz (the servers' logs); under 9 minutes, so that one device command of 600 s holds it.
#
# Environment overrides:
#   CPUS      the CPU class (default cpu:8: the other cores run the HTTP
#             handlers, the GPU streams' threads and the load generator)
#   GPU       the GPU class (default cuda:0x2: two streams)
#   ROUNDS    rounds (default 2)
#   ROWS      rows per request (default 16)
#   SECONDS_PER_PROBE   load per probe (default 2)
#   SWEEP_TIMEOUT  seconds the sweep may run (default 540)
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
serve() { # NAME DEVICES POLICY
  echo "$1=.bin/coexec serve --addr 127.0.0.1:0 --devices $2 --policy $3 --profile-dir {profile_dir}"
}
timeout "${SWEEP_TIMEOUT:-540}" .bin/coexec-load \
  --rate 200 --requests 300 --probe-seconds "${SECONDS_PER_PROBE:-2}" --capacity-p99-ms 50 \
  --rows-per-request "${ROWS:-16}" --timeout 2 --rounds "${ROUNDS:-2}" --log-dir "$LOGS" \
  --server "$(serve cpu "$CPUS" hybrid)" --server "$(serve gpu "$GPU" hybrid)" \
  --server "$(serve greedy "$GPU,$CPUS" greedy)" --server "$(serve hybrid "$GPU,$CPUS" hybrid)" \
  > "$OUT/serve-sweep-gpu.txt" 2>&1
rc=$?
tar -czf "$OUT/serve-logs.tar.gz" -C "$LOGS" . && rm -rf "$LOGS"
echo "serve sweep rc=$rc"
exit $rc
