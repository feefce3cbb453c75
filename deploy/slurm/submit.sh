#!/usr/bin/env bash
# Submits a corpus's embedding as a Slurm job array of SHARDS tasks and the
# merge step after it; prints the two job ids.
#
#   deploy/slurm/submit.sh CORPUS MODEL OUT SHARDS [sbatch options for the array...]
#
# CORPUS, MODEL and OUT must be paths every node sees (OUT is made). The
# extra options go to the array's sbatch, e.g. `--cpus-per-task=16`,
# `--partition=gpu`, or `--gres=none` where the nodes have no GPU.
# COEXEC names the coexec binary (default: `coexec` on the nodes' PATH).
set -euo pipefail
me=submit
[ $# -ge 4 ] || { echo "$me: usage: $0 CORPUS MODEL OUT SHARDS [sbatch options...]" >&2; exit 2; }
CORPUS=$(realpath "$1") MODEL=$(realpath "$2") OUT=$(realpath -m "$3") SHARDS=$4
shift 4
case $SHARDS in '' | *[!0-9]* | 0) echo "$me: SHARDS must be a count of 1 or more, not '$SHARDS'" >&2; exit 2 ;; esac
[ -f "$CORPUS" ] || { echo "$me: $CORPUS: no such file" >&2; exit 2; }
[ -d "$MODEL" ] || { echo "$me: $MODEL: no such folder" >&2; exit 2; }
mkdir -p "$OUT"
here=$(dirname "$(realpath "$0")")
export CORPUS MODEL OUT SHARDS
array=$(sbatch --parsable --export=ALL --chdir="$OUT" --array="0-$((SHARDS - 1))" "$@" "$here/embed.sbatch")
array=${array%%;*}
merge=$(sbatch --parsable --export=ALL --chdir="$OUT" --dependency="afterok:$array" --kill-on-invalid-dep=yes "$here/merge.sbatch")
echo "array $array"
echo "merge ${merge%%;*}"
