#!/usr/bin/env bash
# GPU check, run on the GPU machine (no Rust toolchain, no network) from the
# repository root. Needs the prebuilt binaries in .bin/ (see scripts/README.md):
#   .bin/coexec            the CLI
#   .bin/cuda_equals_cpu   the kernels' GPU-vs-CPU test binary
# Writes everything into $OUT (default ./gpu-out) and prints a short table last.
# Budget: about 8 minutes (each step has its own timeout).
#
# Environment overrides:
#   DEVICES      device spec for the benchmark (default cpu,cuda:0x4)
#   WORKLOADS    benchmark workloads (default: matmul kmeans pathfinder nbody)
#   BENCH_ARGS   extra arguments for `coexec bench` (sizes, --repeat)
set -u
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
DEVICES=${DEVICES:-cpu,cuda:0x4}
WORKLOADS=${WORKLOADS:-matmul kmeans pathfinder nbody}
BENCH_ARGS=${BENCH_ARGS:---repeat 1}
declare -a ROWS=()
row() { ROWS+=("$(printf '%-18s %-6s %s' "$1" "$2" "$3")"); }

# --- environment --------------------------------------------------------
{
  date -u
  uname -a
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  nproc
} >"$OUT/env.txt" 2>&1

# NVRTC lives in the toolkit's lib64, which is not on the loader path.
NVRTC=$(find / -name 'libnvrtc.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1)
if [ -n "$NVRTC" ]; then
  export LD_LIBRARY_PATH="$(dirname "$NVRTC")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  row nvrtc ok "$NVRTC"
else
  row nvrtc MISSING "no libnvrtc.so.13 found; GPU kernels cannot compile"
fi
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" >>"$OUT/env.txt"

for b in .bin/coexec .bin/cuda_equals_cpu; do
  [ -x "$b" ] || { echo "missing $b (build it first, see scripts/README.md)" >&2; row "$b" MISSING ""; }
done

# --- devices ----------------------------------------------------------------
if [ -x .bin/coexec ]; then
  timeout 60 .bin/coexec devices >"$OUT/devices.txt" 2>&1
  rc=$?
  row devices "rc=$rc" "$(grep -ci cuda "$OUT/devices.txt") line(s) mention cuda"
fi

# --- GPU == CPU, bit for bit ----------------------------------------------------
if [ -x .bin/cuda_equals_cpu ]; then
  # One test at a time so the GPU timings and failures are easy to read.
  timeout 240 .bin/cuda_equals_cpu --include-ignored --nocapture --test-threads=1 >"$OUT/cuda_equals_cpu.txt" 2>&1
  rc=$?
  res=$(grep -E '^test result' "$OUT/cuda_equals_cpu.txt" | tail -1)
  skipped=$(grep -c 'SKIPPED' "$OUT/cuda_equals_cpu.txt")
  row cuda_equals_cpu "rc=$rc" "${res:-no result line} ; SKIPPED lines: $skipped"
  failed=$(sed -n '/^failures:$/,/^test result/p' "$OUT/cuda_equals_cpu.txt" | grep -E '^    [a-z_]+$' | tr -d ' ' | sort -u | tr '\n' ' ')
  skips=$(grep -oE '[a-z_]+: SKIPPED' "$OUT/cuda_equals_cpu.txt" | cut -d: -f1 | sort -u | tr '\n' ' ')
  [ -n "$failed" ] && row "  failed" "" "$failed"
  [ -n "$skips" ] && row "  skipped" "" "$skips"
fi

# --- co-execution benchmark -----------------------------------------------------
if [ -x .bin/coexec ]; then
  # shellcheck disable=SC2086
  timeout 300 .bin/coexec bench $WORKLOADS --devices "$DEVICES" \
    --policies cpu-only,accel-only,static,static+dynamic,hybrid \
    --json "$OUT/bench.json" $BENCH_ARGS >"$OUT/bench.txt" 2>&1
  rc=$?
  row bench "rc=$rc" "devices $DEVICES; table in bench.txt, data in bench.json"
fi

# --- summary ----------------------------------------------------------------------
{
  echo
  echo "== coexec GPU check ($(date -u +%FT%TZ)) =="
  [ -s "$OUT/devices.txt" ] && sed 's/^/  /' "$OUT/devices.txt" | head -8
  printf '%-18s %-6s %s\n' step status detail
  for r in "${ROWS[@]}"; do echo "$r"; done
  if [ -s "$OUT/bench.txt" ]; then
    echo
    echo "-- bench (last 40 lines) --"
    tail -40 "$OUT/bench.txt"
  fi
} | tee "$OUT/summary.txt"
