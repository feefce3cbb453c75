#!/usr/bin/env bash
# The measured limit on a GPU machine: `coexec bench --oracle` on the four
# workloads (each class alone, static+dynamic and hybrid beside the best
# fixed split measured, T_oracle), and kmeans at a size whose step takes
# 10 ms or more on an H200's GPU alone (`--points 4000000`; kdd_cup's
# 494 020 points take about 1.6 ms). Run from the repository root with
# .bin/ as scripts/README.md step 1 builds it; writes $OUT/oracle.txt and
# $OUT/oracle.json (the per-workload reports as a list). Each workload has
# its own timeout; the whole stays under 9 minutes, one 600 s command.
#
# Environment overrides: DEVICES (default: coexec's own), WORKLOADS,
# MATMUL_ARGS, KMEANS_ARGS, PATHFINDER_ARGS, NBODY_ARGS, BIG_KMEANS_ARGS
# (empty string: skip it), BENCH_ARGS (default --budget 20 --pairs 0), T
# (seconds a workload may take, default 80; the large kmeans gets twice).
set -u
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
. scripts/cuda_env.sh
[ -x .bin/coexec ] || { echo "missing .bin/coexec (build it first, see scripts/README.md)" >&2; exit 2; }
[ -f .bin/data/kdd_cup.xz ] && export COEXEC_KMEANS_DATA="$PWD/.bin/data"
DEVICES=${DEVICES:-}
WORKLOADS=${WORKLOADS:-matmul kmeans pathfinder nbody}
MATMUL_ARGS=${MATMUL_ARGS:---count 30000}
KMEANS_ARGS=${KMEANS_ARGS:-}
PATHFINDER_ARGS=${PATHFINDER_ARGS:-}
NBODY_ARGS=${NBODY_ARGS:---bodies 65536 --steps 4}
BIG_KMEANS_ARGS=${BIG_KMEANS_ARGS---points 4000000}
BENCH_ARGS=${BENCH_ARGS:---budget 20 --pairs 0}
T=${T:-80}
TMP=$(mktemp -d)
: >"$OUT/oracle.txt"

# bench NAME WORKLOAD SECONDS ARGS...
bench() {
  local name=$1 w=$2 t=$3
  shift 3
  echo "== $name: coexec bench $w $* --oracle" >>"$OUT/oracle.txt"
  # shellcheck disable=SC2086
  timeout "$t" .bin/coexec bench "$w" ${DEVICES:+--devices "$DEVICES"} \
    --policies cpu-only,accel-only,static+dynamic,hybrid --oracle --quiet \
    --json "$TMP/$name.json" "$@" $BENCH_ARGS >>"$OUT/oracle.txt" 2>&1
  echo "== $name rc=$?" >>"$OUT/oracle.txt"
}

for w in $WORKLOADS; do
  case $w in
    matmul) WA=$MATMUL_ARGS ;; kmeans) WA=$KMEANS_ARGS ;;
    pathfinder) WA=$PATHFINDER_ARGS ;; nbody) WA=$NBODY_ARGS ;; *) WA= ;;
  esac
  # shellcheck disable=SC2086
  bench "$w" "$w" "$T" $WA
done
# shellcheck disable=SC2086
[ -n "$BIG_KMEANS_ARGS" ] && bench kmeans-big kmeans $((2 * T)) $BIG_KMEANS_ARGS

python3 - "$TMP" >"$OUT/oracle.json" <<'PY'
import glob, json, sys
print(json.dumps([json.load(open(f)) for f in sorted(glob.glob(sys.argv[1] + "/*.json"))], indent=1))
PY
rm -rf "$TMP"
grep -E '^==|^  (T |T\*|T_oracle|policy|cpu-only|accel-only|static|hybrid|oracle)' "$OUT/oracle.txt"
