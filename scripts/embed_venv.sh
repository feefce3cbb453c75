#!/usr/bin/env bash
# The Python environment of the embedding tools (bert_reference.py,
# bert_onnx.py, ort_embed_bench.py): target/embed-venv with
# scripts/requirements-embed.txt, made once and reused while the pins match
# (a copy of the requirements file inside the venv records what it holds).
#   PY=$(scripts/embed_venv.sh | tail -1)
# EMBED_VENV=DIR puts it elsewhere. The venv's python is the last stdout line.
set -euo pipefail
me=embed_venv
[ $# -eq 0 ] || { echo "$me: takes no arguments (EMBED_VENV=DIR for another place)" >&2; exit 2; }
cd "$(dirname "$0")/.."
REQ=scripts/requirements-embed.txt
V=${EMBED_VENV:-target/embed-venv}
if ! cmp -s "$REQ" "$V/requirements-embed.txt" 2>/dev/null || [ ! -x "$V/bin/python" ]; then
  echo "$me: installing $REQ into $V" >&2
  python3 -m venv "$V" >&2 || { echo "$me: python3 -m venv $V failed" >&2; exit 1; }
  "$V/bin/python" -m pip install --quiet -r "$REQ" >&2 \
    || { echo "$me: pip install -r $REQ failed" >&2; exit 1; }
  cp "$REQ" "$V/requirements-embed.txt"
else
  echo "$me: $V up to date" >&2
fi
"$V/bin/python" -c 'import numpy, tokenizers, onnx, onnxruntime as o
print("embed_venv: numpy", numpy.__version__, "tokenizers", tokenizers.__version__,
      "onnx", onnx.__version__, "onnxruntime", o.__version__)' >&2
echo "$(cd "$V" && pwd)/bin/python"
