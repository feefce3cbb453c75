#!/usr/bin/env bash
# Device memory checked before allocating, on a real GPU. PyTorch holds all
# but LEFT_MIB (default 1536) of the GPU's free memory; then coexec runs
# kmeans on `--points POINTS` (default 20 000 000: an input of 2.7 GB, more
# than is left) twice: on the GPU alone, where the run must end with the
# error that names the sizes (never a CUDA out-of-memory), and on the GPU
# and 4 cores, where the refused chunks must run on the cores and the run
# complete. Then the same GPU-and-cores run with the memory released, for the
# split it makes when the input fits. Run from the repository root with
# .bin/ as scripts/README.md step 1 builds it; writes $OUT/gpu-memory.txt.
# Each run has a fresh profile and its own timeout (RUN_S, default 120: 7
# minutes at most in all; about 2 expected: 20 M points take tens of
# seconds on 4 cores).
set -u
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
. scripts/cuda_env.sh
[ -x .bin/coexec ] || { echo "missing .bin/coexec (build it first, see scripts/README.md)" >&2; exit 2; }
LEFT_MIB=${LEFT_MIB:-1536}
POINTS=${POINTS:-20000000}
GPU=${GPU:-cuda:0x2}
RUN_S=${RUN_S:-120}
TMP=$(mktemp -d)
LOG="$OUT/gpu-memory.txt"
: >"$LOG"

# The runs of a `coexec run --json` report: per run, each class's items and
# chunks, and the retries (a refused chunk is one).
summary() {
  python3 - "$1" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"no report: {e}")
    sys.exit()
print(f"iterations {d['result'].get('iterations')}, runs {len(d['runs'])}, {d['runs_s']:.3f} s")
runs = d["runs"]
for i in sorted({0, 1, 2, len(runs) - 1} & set(range(len(runs)))):
    r = runs[i]
    cls = ", ".join(f"{c['name']} {c['items']} items in {c['chunks']} chunks" for c in r["classes"])
    print(f"run {i}: {r['makespan_s']:.4f} s, {cls}, retries {r['retries']}")
PY
}

# The holder lets go by itself after the runs' timeouts, should this script
# be stopped before it kills it.
python3 - "$LEFT_MIB" $((2 * RUN_S + 60)) >"$TMP/hold.txt" 2>&1 <<'PY' &
import sys, time, torch
free, total = torch.cuda.mem_get_info()
left = int(sys.argv[1]) << 20
held = torch.empty(max(free - left, 0), dtype=torch.uint8, device="cuda")
free2, _ = torch.cuda.mem_get_info()
print(f"held {held.numel() >> 20} MiB; free now {free2 >> 20} MiB of {total >> 20} MiB", flush=True)
time.sleep(int(sys.argv[2]))
PY
hold=$!
for _ in $(seq 120); do
  grep -q held "$TMP/hold.txt" && break
  kill -0 $hold 2>/dev/null || break
  sleep 0.5
done
{
  echo "== holder: $(cat "$TMP/hold.txt")"
  nvidia-smi --query-gpu=memory.used,memory.free,memory.total --format=csv
  echo "== $GPU alone, kmeans --points $POINTS (expect a device-memory error naming the sizes)"
  timeout "$RUN_S" .bin/coexec run kmeans --points "$POINTS" --devices "$GPU" --quiet --profile-dir "$TMP/p1"
  echo "== rc=$?"
  echo "== $GPU and 4 cores (expect the refused chunks on the cores, the run complete)"
  timeout "$RUN_S" .bin/coexec run kmeans --points "$POINTS" --devices "$GPU,cpu:4" --quiet --profile-dir "$TMP/p2" --json >"$TMP/held.json"
  echo "== rc=$?"
  summary "$TMP/held.json"
} >>"$LOG" 2>&1
kill $hold 2>/dev/null
wait $hold 2>/dev/null
{
  echo "== memory released: $GPU and 4 cores"
  nvidia-smi --query-gpu=memory.used,memory.free,memory.total --format=csv
  timeout "$RUN_S" .bin/coexec run kmeans --points "$POINTS" --devices "$GPU,cpu:4" --quiet --profile-dir "$TMP/p3" --json >"$TMP/free.json"
  echo "== rc=$?"
  summary "$TMP/free.json"
} >>"$LOG" 2>&1
rm -rf "$TMP"
grep -vE '^\s*[{}\[\]]' "$LOG" | head -80
