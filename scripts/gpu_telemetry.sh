#!/usr/bin/env bash
# coexec's GPU telemetry beside nvidia-smi's on a GPU machine: `coexec serve`
# with --gpu-telemetry-s 1 under load from coexec-load, and three times a
# second apart `/metrics`' coexec_gpu_* lines next to `nvidia-smi
# --query-gpu` of the same readings. Run from the repository root with
# .bin/ as scripts/README.md step 1 builds it; writes
# $OUT/gpu-telemetry.txt. About 20 s.
set -u
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
. scripts/cuda_env.sh
for b in .bin/coexec .bin/coexec-load; do
  [ -x "$b" ] || { echo "missing $b (build it first, see scripts/README.md)" >&2; exit 2; }
done
TMP=$(mktemp -d)
PORT=${PORT:-18093}
.bin/coexec serve --addr "127.0.0.1:$PORT" --devices "${GPU:-cuda:0x2},cpu:4" \
  --gpu-telemetry-s 1 --profile-dir "$TMP/p" >"$TMP/serve.log" 2>&1 &
srv=$!
# Ready once it has warmed every device up (up to a minute); a server that
# has exited is not waited for.
for _ in $(seq 300); do
  curl -sf "127.0.0.1:$PORT/readyz" >/dev/null && break
  kill -0 $srv 2>/dev/null || break
  sleep 0.2
done
if ! curl -sf "127.0.0.1:$PORT/readyz" >/dev/null; then
  # A server that never came up: its own words, not a load run against nothing.
  { echo "== serve did not come up"; tail -n 20 "$TMP/serve.log"; } >"$OUT/gpu-telemetry.txt"
  kill -TERM $srv 2>/dev/null; wait $srv 2>/dev/null
  rm -rf "$TMP"
  cat "$OUT/gpu-telemetry.txt"
  exit 1
fi
.bin/coexec-load --target "http://127.0.0.1:$PORT" --rate 400 --requests 4000 \
  --rows-per-request 64 >"$TMP/load.txt" 2>&1 &
load=$!
{
  for i in 1 2 3; do
    sleep 1
    echo "== sample $i, $(date +%T.%N)"
    nvidia-smi --query-gpu=index,uuid,utilization.gpu,utilization.memory,memory.used,memory.free,power.draw,temperature.gpu,clocks.sm \
      --format=csv,noheader
    curl -s "127.0.0.1:$PORT/metrics" | grep -E '^coexec_(gpu_|telemetry_up)'
  done
  wait $load
  echo "== load"; tail -n 5 "$TMP/load.txt"
} >"$OUT/gpu-telemetry.txt" 2>&1
kill -TERM $srv; wait $srv
echo "== serve exit $?" >>"$OUT/gpu-telemetry.txt"
tail -n 20 "$TMP/serve.log" >>"$OUT/gpu-telemetry.txt"
rm -rf "$TMP"
cat "$OUT/gpu-telemetry.txt"
