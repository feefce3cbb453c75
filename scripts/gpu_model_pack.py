#!/usr/bin/env python3
"""Packs the embedding model for the GPU machine, whose carried tree is
capped at 64 MiB (the model alone is 87 MB), and unpacks it there.

The word-embedding rows of tokens that no line of the given corpora uses
(special tokens aside) are zeroed: the encoder reads only the rows of the
ids it is given, so every vector of those corpora is unchanged, bit for
bit. The tensors' bytes are then laid out byte plane by byte plane (the
four bytes of each float apart: the sign and exponent bytes repeat much)
and compressed with xz: 87 MB to about 36 MiB. Everything else in the
folder is copied as is.

    $PY scripts/gpu_model_pack.py --model ~/.cache/coexec/models/all-MiniLM-L6-v2 \\
        --corpus tests/data/embed_sentences.jsonl --out .bin-embed/model \\
        --reference target/embed/reference-*.json
    python3 scripts/gpu_model_pack.py --unpack .bin-embed/model     # on the GPU machine

--reference (scripts/bert_reference.py's JSON for the first corpus) also
writes reference.npy (its fp64 embeddings, [n, H]) and ids.jsonl (its token
ids, one list a line: what scripts/torch_embed_bench.py reads, since the GPU
machine has no tokenizers package). Packing needs numpy and tokenizers
(scripts/embed_venv.sh), unpacking numpy alone. Prints the sizes and the
rows kept.
"""

import argparse
import json
import lzma
import os
import shutil
import struct
import sys


WORD = "embeddings.word_embeddings.weight"
PACKED = "model.safetensors.planes.xz"


def unpack(folder):
    """DIR/model.safetensors from DIR/model.safetensors.planes.xz."""
    with lzma.open(os.path.join(folder, PACKED), "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    planes = memoryview(raw)[8 + n :]
    q = len(planes) // 4
    body = bytearray(len(planes))
    for b in range(4):
        body[b::4] = planes[b * q : (b + 1) * q]
    out = os.path.join(folder, "model.safetensors")
    with open(out, "wb") as f:
        f.write(raw[: 8 + n])
        f.write(body)
    print(f"{out}: {os.path.getsize(out) / 2**20:.1f} MiB")


def texts(path):
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            try:
                v = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON: {e}")
            yield v["text"] if isinstance(v, dict) else v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--corpus", action="append")
    ap.add_argument("--out")
    ap.add_argument("--reference", help="bert_reference.py's JSON of the first corpus")
    ap.add_argument("--unpack", metavar="DIR", help="restore DIR/model.safetensors")
    a = ap.parse_args()
    if a.unpack:
        return unpack(a.unpack)
    if not (a.model and a.corpus and a.out):
        ap.error("--model, --corpus and --out are needed to pack")
    pack(a)


def pack(a):
    # Imported here: unpacking, on the GPU machine, needs neither.
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    used = set()
    for c in a.corpus:
        for t in texts(c):
            used.update(tok.encode(t).ids)
    # The special tokens ([PAD] [UNK] [CLS] [SEP] [MASK]) whatever the corpus.
    with open(os.path.join(a.model, "tokenizer.json"), encoding="utf-8") as f:
        used.update(t["id"] for t in json.load(f).get("added_tokens", []))

    src = os.path.join(a.model, "model.safetensors")
    with open(src, "rb") as f:
        raw = bytearray(f.read())
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    name = WORD if WORD in header else "bert." + WORD
    info = header[name]
    if info["dtype"] != "F32":
        sys.exit(f"{src}: {name} is {info['dtype']}, not F32")
    vocab, h = info["shape"]
    lo, hi = info["data_offsets"]
    base = 8 + n + lo
    rows = np.frombuffer(raw, dtype="<f4", count=vocab * h, offset=base).reshape(vocab, h).copy()
    keep = np.zeros(vocab, dtype=bool)
    keep[[i for i in used if i < vocab]] = True
    rows[~keep] = 0.0
    raw[base : base + vocab * h * 4] = rows.astype("<f4").tobytes()

    os.makedirs(a.out, exist_ok=True)
    for entry in os.listdir(a.model):
        p = os.path.join(a.model, entry)
        if entry == "model.safetensors":
            continue
        if os.path.isdir(p):
            shutil.copytree(p, os.path.join(a.out, entry), dirs_exist_ok=True)
        else:
            shutil.copy2(p, os.path.join(a.out, entry))
    packed = os.path.join(a.out, PACKED)
    body = np.frombuffer(raw, dtype=np.uint8, offset=8 + n)
    if len(body) % 4:
        sys.exit(f"{src}: tensor bytes not a whole number of floats")
    planes = body.reshape(-1, 4).T.tobytes()
    with lzma.open(packed, "wb", preset=9) as f:
        f.write(raw[: 8 + n])
        f.write(planes)
    if a.reference:
        with open(a.reference, encoding="utf-8") as f:
            items = sorted(json.load(f)["items"], key=lambda it: it["index"])
        np.save(os.path.join(a.out, "reference.npy"), np.array([it["embedding"] for it in items]))
        with open(os.path.join(a.out, "ids.jsonl"), "w") as f:
            for it in items:
                f.write(json.dumps(it["ids"]) + "\n")
    with open(os.path.join(a.out, "kept_ids.txt"), "w") as f:
        f.write(f"{int(keep.sum())} of {vocab} word-embedding rows kept (the rest zeroed)\n")
    print(
        f"{packed}: {os.path.getsize(packed) / 2**20:.1f} MiB from {len(raw) / 2**20:.1f} MiB; "
        f"{int(keep.sum())} of {vocab} rows kept"
    )


if __name__ == "__main__":
    main()
