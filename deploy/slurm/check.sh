#!/usr/bin/env bash
# The Slurm scripts beside this file, tried on a three-node Slurm cluster on
# this host (local-cluster.sh): a corpus embedded by a 3-task job array
# and merged must equal, row for row, the same corpus embedded by one
# process; one task is requeued mid-way and must resume without losing or
# repeating a line; a task given one CPU must run one CPU worker.
#
#   deploy/slurm/check.sh [--lines N] [--coexec BIN] [--model DIR]
#
# N: corpus lines (default 30000). BIN: the coexec binary (default
# target/release/coexec). DIR: the model (default: scripts/fetch_model.sh's
# cache). Exits 0 with a line starting "skipped:" where Slurm, root or the
# model is missing; 1 on a failed check.
set -euo pipefail
me=slurm-check
cd "$(dirname "$0")/../.."
LINES=30000
COEXEC=$PWD/target/release/coexec
MODEL=${COEXEC_EMBED_MODEL:-${COEXEC_MODEL_CACHE:-$HOME/.cache/coexec/models}/all-MiniLM-L6-v2}
while [ $# -gt 0 ]; do
    case $1 in
    --lines) LINES=$2; shift 2 ;;
    --coexec) COEXEC=$(realpath "$2"); shift 2 ;;
    --model) MODEL=$(realpath "$2"); shift 2 ;;
    *) echo "$me: usage: $0 [--lines N] [--coexec BIN] [--model DIR]" >&2; exit 2 ;;
    esac
done
for tool in slurmctld slurmd sbatch munged; do
    command -v $tool >/dev/null || { echo "skipped: no $tool (apt-get install slurm-wlm munge)"; exit 0; }
done
[ "$(id -u)" -eq 0 ] || { echo "skipped: the local cluster's daemons need root"; exit 0; }
[ -f "$MODEL/model.safetensors" ] || { echo "skipped: no model at $MODEL (scripts/fetch_model.sh)"; exit 0; }
[ -x "$COEXEC" ] || { echo "$me: no coexec binary at $COEXEC (cargo build --release)" >&2; exit 1; }

W=$(mktemp -d /tmp/coexec-slurm.XXXXXX)
cleanup() { deploy/slurm/local-cluster.sh stop "$W/cluster" || true; }
trap cleanup EXIT
eval "$(deploy/slurm/local-cluster.sh start "$W/cluster")"
export COEXEC
fail() { echo "$me: FAILED: $*" >&2; exit 1; }

# The corpus: N distinct sentences of varied length, the same for any N.
python3 - "$LINES" >"$W/corpus.txt" <<'EOF'
import random, sys
words = ("grid node shard queue tensor model vector batch stream kernel core "
         "cluster token corpus embed device memory split worker profile").split()
rng = random.Random(7)
for i in range(int(sys.argv[1])):
    n = rng.randint(3, 40)
    print(f"line {i + 1}: " + " ".join(rng.choice(words) for _ in range(n)))
EOF

# One process: the reference.
t0=$(date +%s.%N)
"$COEXEC" embed --model "$MODEL" --input "$W/corpus.txt" --output "$W/one.npy" --quiet \
    --profile-dir "$W/profiles-one"
echo "one process: $(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $t0}") s"

# A task with one CPU runs one CPU worker.
one=$(srun --cpus-per-task=1 --gres=none "$COEXEC" devices --json)
echo "$one" | python3 -c '
import json, sys
d = json.load(sys.stdin)
cpu = [c for c in d["classes"] if c["name"] == "cpu"]
assert cpu and cpu[0]["workers"] == 1, d
print("--cpus-per-task=1:", cpu[0]["workers"], "CPU worker; affinity", d["fence"]["allowed"])
' || fail "a task with one CPU did not run one CPU worker: $one"

# Three shards; task 1 is requeued once it has written some rows.
mkdir -p "$W/out"
t0=$(date +%s.%N)
ids=$(deploy/slurm/submit.sh "$W/corpus.txt" "$MODEL" "$W/out" 3 --gres=none --cpus-per-task=1)
array=$(echo "$ids" | awk '$1 == "array" {print $2}')
merge=$(echo "$ids" | awk '$1 == "merge" {print $2}')
part1=$W/out/part-1.npy
requeued=no
for _ in $(seq 1200); do
    if [ -f "$part1" ] && [ "$(stat -c %s "$part1")" -gt $((128 + 384 * 4 * 64)) ]; then
        scontrol requeue "${array}_1"
        requeued=yes
        echo "requeued task 1 at $(stat -c %s "$part1") bytes of part-1.npy"
        break
    fi
    sleep 0.1
done
[ $requeued = yes ] || fail "task 1 never wrote 64 rows"
for _ in $(seq 6000); do
    state=$(scontrol show job "$merge" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
    case $state in COMPLETED | FAILED | CANCELLED | TIMEOUT | OUT_OF_MEMORY | NODE_FAIL) break ;; esac
    # A requeued task waits out the begin time Slurm gives it (about two
    # minutes); moving it earlier (`scontrol update StartTime=now`) made
    # Slurm cancel the dependent merge here.
    sleep 0.2
done
echo "array and merge: $(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $t0}") s, merge $state"
[ "$state" = COMPLETED ] || { tail -n 20 "$W"/out/*.log >&2; fail "the merge step ended $state"; }
log1=$(ls "$W"/out/coexec-embed-*_1.log)
restarts=$(grep -c "shard 1/3" "$log1" || true)
resumed=$(grep -o "[0-9]* rows resumed" "$log1" | cut -d' ' -f1 || true)
echo "task 1: ran $restarts times, resumed at row ${resumed:-none}"
[ "$restarts" -ge 2 ] || fail "task 1 ran $restarts time(s), not requeued"
[ "${resumed:-0}" -gt 0 ] || fail "task 1 did not resume its shard"

# Same rows, same order.
python3 - "$W/one.npy" "$W/out/embeddings.npy" <<'EOF'
import struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<H", b[8:10])[0]
    head = b[10:10 + n].decode()
    shape = tuple(int(x) for x in head.split("'shape': (")[1].split(")")[0].split(",") if x.strip())
    data = struct.unpack(f"<{shape[0] * shape[1]}f", b[10 + n:])
    return shape, data
(sa, a), (sb, b) = load(sys.argv[1]), load(sys.argv[2])
assert sa == sb, (sa, sb)
worst = max(abs(x - y) for x, y in zip(a, b))
same = sum(x == y for x, y in zip(a, b))
print(f"{sa[0]} rows of {sa[1]}: {same} of {len(a)} values identical, largest difference {worst:.2e}")
# Batches differ between the runs (a shard's batches are not the one
# process's), and a row's sums run in another order with another padding.
assert worst < 1e-5, worst
EOF
echo "$me: ok"
