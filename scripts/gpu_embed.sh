#!/usr/bin/env bash
# The sentence encoder on the GPU machine, run from the repository root
# with what scripts/README.md step 1b puts in .bin-embed/ (an ignored
# folder, carried: `carry: [".bin-embed"]`, about 47 MiB):
#   .bin-embed/{coexec,coexec-load,cuda_equals_cpu}.xz   stripped binaries
#   .bin-embed/model/   the model packed by scripts/gpu_model_pack.py, with
#                       reference.npy (fp64) and ids.jsonl of the test corpus
# Steps, each with its own timeout (about 6 minutes in all):
#   0. every other GPU test of cuda_equals_cpu (the workloads bit for bit,
#      the MLP, the twin contract, take-back, pinned copies), as
#      gpu_check.sh's step 4 does, for a lease too short for both scripts;
#   1. bert_cuda_matches_cpu: the GPU twin against the CPU pass (uneven
#      chunks on two streams, pieces, every group shape);
#   2. `coexec embed` on the GPU alone over tests/data/embed_sentences.jsonl
#      against the fp64 reference (min cosine; the bound is 0.99999);
#   3. `coexec embed` on 10 000 lines (the corpus cycled) on the CPU class
#      alone, the GPU alone and both: texts/s side by side;
#   4. PyTorch on the same GPU over the same ids (scripts/torch_embed_bench.py);
#   5. `coexec serve` on each of the three, `coexec-load --texts` at rising
#      rates, 1 text and 32 texts a request: p50/p99 per rate.
# Writes its files into $OUT (default ./gpu-out) and prints a table last.
#
# Environment overrides:
#   CPUS   the CPU class (default cpu:12: the other cores tokenise, run the
#          GPU streams' threads, the HTTP handlers and the load generator)
#   GPU    the GPU class (default cuda:0x2)
#   STEPS  the steps to run (default "0 1 2 3 4 5")
#   RATES1, RATES32   coexec-load's rates for 1 and 32 texts a request
#   COUNT  lines of the throughput corpus (default 10000)
#   SPECS  the device specs of step 3 (default "$CPUS $GPU $GPU,$CPUS")
#   ROUNDS rounds of step 3 (default 2; a profile carries over between them)
set -u
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
CPUS=${CPUS:-cpu:12}
GPU=${GPU:-cuda:0x2}
STEPS=${STEPS:-0 1 2 3 4 5}
RATES1=${RATES1:-50,200,800,1600,3200}
RATES32=${RATES32:-5,20,50,100,200}
COUNT=${COUNT:-10000}
SPECS=${SPECS:-$CPUS $GPU $GPU,$CPUS}
ROUNDS=${ROUNDS:-2}
B=.bin-embed
MODEL=$B/model
CORPUS=tests/data/embed_sentences.jsonl
BIN=$(mktemp -d)
TMP=$(mktemp -d)
declare -a ROWS=()
row() { ROWS+=("$(printf '%-24s %-8s %s' "$1" "$2" "$3")"); }
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }

. scripts/cuda_env.sh
{
  date -u
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  echo "cores: $(nproc)"
  echo "CUDA_LIB=${CUDA_LIB:-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
} >"$OUT/embed-env.txt" 2>&1

for b in coexec coexec-load cuda_equals_cpu; do
  if [ -f "$B/$b.xz" ]; then
    xz -dc "$B/$b.xz" >"$BIN/$b" && chmod +x "$BIN/$b"
  else
    row "$b" MISSING "no $B/$b.xz (scripts/README.md step 1b)"
  fi
done
if [ -f "$MODEL/model.safetensors.planes.xz" ] && [ ! -f "$MODEL/model.safetensors" ]; then
  python3 scripts/gpu_model_pack.py --unpack "$MODEL" >>"$OUT/embed-env.txt" 2>&1 \
    || row model FAILED "unpacking $MODEL"
fi
[ -f "$MODEL/model.safetensors" ] || { row model MISSING "$MODEL"; STEPS=""; }
export COEXEC_PROFILE_DIR="$TMP/profiles"

# --- 0: the other GPU tests -----------------------------------------------------
if has 0 && [ -x "$BIN/cuda_equals_cpu" ]; then
  timeout 150 "$BIN/cuda_equals_cpu" --include-ignored --skip bert_cuda_matches_cpu --skip rayon_baseline:: \
    --nocapture --test-threads=1 >"$OUT/cuda-equals-cpu.txt" 2>&1
  rc=$?
  row cuda_equals_cpu "rc=$rc" "$(grep -E '^test result' "$OUT/cuda-equals-cpu.txt" | tail -1)"
fi

# --- 1: the twin against the CPU pass ------------------------------------------
if has 1 && [ -x "$BIN/cuda_equals_cpu" ]; then
  COEXEC_EMBED_MODEL="$MODEL" timeout 240 "$BIN/cuda_equals_cpu" --include-ignored --exact \
    cuda_equals_cpu::bert_cuda_matches_cpu --nocapture --test-threads=1 >"$OUT/embed-twin.txt" 2>&1
  rc=$?
  row bert_cuda_matches_cpu "rc=$rc" "$(grep -oE 'min cosine gpu vs cpu [0-9.]+' "$OUT/embed-twin.txt" | tr '\n' ';')"
fi

# --- 2: the GPU alone against the fp64 reference ---------------------------------
if has 2 && [ -x "$BIN/coexec" ]; then
  timeout 120 "$BIN/coexec" embed -q --model "$MODEL" --devices "$GPU" --input "$CORPUS" \
    --output "$TMP/gpu.npy" >"$OUT/embed-reference.txt" 2>&1
  rc=$?
  python3 - "$TMP/gpu.npy" "$MODEL/reference.npy" >>"$OUT/embed-reference.txt" 2>&1 <<'EOF'
import sys
import numpy as np
got = np.load(sys.argv[1]).astype(np.float64)
ref = np.load(sys.argv[2])
cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
print(f"gpu vs fp64 reference: {len(cos)} sentences, min cosine {cos.min():.12f} "
      f"(sentence {int(cos.argmin())}), mean {cos.mean():.12f}")
EOF
  row "embed gpu vs fp64" "rc=$rc" "$(grep -oE 'min cosine [0-9.]+' "$OUT/embed-reference.txt")"
fi

# --- 3: throughput of `coexec embed`, side by side --------------------------------
if has 3 && [ -x "$BIN/coexec" ]; then
  python3 -c "
import itertools, sys
lines = open('$CORPUS', encoding='utf-8').read().splitlines()
sys.stdout.write(''.join(l + '\n' for l in itertools.islice(itertools.cycle(lines), $COUNT)))
" >"$TMP/corpus10k.jsonl"
  for round in $(seq 1 "$ROUNDS"); do
    for spec in $SPECS; do
      rm -f "$TMP/out.npy"
      line=$(timeout 120 "$BIN/coexec" embed -q --model "$MODEL" --devices "$spec" \
        --input "$TMP/corpus10k.jsonl" --output "$TMP/out.npy" 2>&1 | tail -1)
      echo "round $round, $spec: $line" >>"$OUT/embed-throughput.txt"
    done
  done
  cat "$COEXEC_PROFILE_DIR"/*.json >"$OUT/embed-profile.json" 2>/dev/null
  for spec in $SPECS; do
    row "embed $COUNT $spec" "" "$(grep -F ", $spec: " "$OUT/embed-throughput.txt" | grep -oE '[0-9.]+ texts/s' | tr '\n' ' ')"
  done
fi

# --- 4: PyTorch on the same GPU ------------------------------------------------------
if has 4; then
  timeout 180 python3 scripts/torch_embed_bench.py --model "$MODEL" --ids "$MODEL/ids.jsonl" \
    --count "$COUNT" --reference "$MODEL/reference.npy" >"$OUT/embed-torch.json" 2>"$OUT/embed-torch.err"
  rc=$?
  row "torch $COUNT" "rc=$rc" "$(python3 -c "
import json; r = json.load(open('$OUT/embed-torch.json'))
print(f\"{r['median_texts_per_s']:.0f} texts/s, min cosine {r.get('min_cosine_vs_fp64', 0):.9f}\")" 2>/dev/null)"
fi

# --- 5: the service ------------------------------------------------------------------
if has 5 && [ -x "$BIN/coexec" ] && [ -x "$BIN/coexec-load" ]; then
  port=18480
  for spec in "$CPUS" "$GPU" "$GPU,$CPUS"; do
    port=$((port + 1))
    log="$TMP/serve-$port.log"
    "$BIN/coexec" serve --model "$MODEL" --devices "$spec" --addr "127.0.0.1:$port" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do
      curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
      sleep 0.2
    done
    for shape in 1 32; do
      rates=$RATES1
      [ "$shape" = 32 ] && rates=$RATES32
      {
        echo "== devices $spec, $shape text(s)/request"
        timeout 150 "$BIN/coexec-load" --target "http://127.0.0.1:$port/embed" --texts "$CORPUS" \
          --rows-per-request "$shape" --rate "$rates" --requests 2000 --duration-limit 3 --timeout 5
        curl -s "http://127.0.0.1:$port/metrics" | grep -E '^coexec_items_total'
      } >>"$OUT/embed-serve.txt" 2>&1
    done
    kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    cat "$log" >>"$OUT/embed-serve-logs.txt"
  done
  row "serve" "" "see embed-serve.txt"
fi

rm -rf "$BIN" "$TMP"
printf '%s\n' "${ROWS[@]}" | tee "$OUT/embed-summary.txt"
