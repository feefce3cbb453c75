#!/usr/bin/env python3
"""sentence-transformers' own embeddings of a corpus in float64, to check
coexec against: each text alone (no padding), tokenised by the model's own
tokenizer as sentence-transformers does, through every module of the
folder's modules.json, with the model's weights upcast to float64.

    PY=/path/to/venv/bin/python   # with torch, transformers, sentence-transformers
    $PY scripts/st_reference.py --model DIR --input tests/data/embed_sentences.jsonl \
        --output ref.json [--take N] [--compare coexec.npy]

--output: {"model", "sentences", "ids", "vectors"} (float64, 17 digits).
--take N: N texts spread over the corpus sorted by length (the longest
among them), instead of every text.
--compare FILE.npy: coexec's vectors of the same texts in order (`coexec
embed --output`), rows of float32: prints the minimum cosine and where.
Not run by CI (it needs torch): its outputs are committed or quoted.
"""

import argparse
import json
import sys

import numpy as np
import torch
from sentence_transformers import SentenceTransformer


def texts_of(path):
    out = []
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        v = json.loads(line)
        out.append(v["text"] if isinstance(v, dict) else v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output")
    ap.add_argument("--take", type=int)
    ap.add_argument("--compare")
    a = ap.parse_args()
    texts = texts_of(a.input)
    if a.take:
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        step = max(1, len(order) // a.take)
        keep = sorted(order[::-1][::step][: a.take])
        texts = [texts[i] for i in keep]
    model = SentenceTransformer(a.model, device="cpu").double().eval()
    ids, vectors = [], []
    with torch.no_grad():
        for t in texts:
            feats = model.tokenize([t])
            ids.append(feats["input_ids"][0].tolist())
            out = model.forward(feats)
            vectors.append(out["sentence_embedding"][0].tolist())
    if a.output:
        json.dump({"model": a.model, "sentences": texts, "ids": ids, "vectors": vectors},
                  open(a.output, "w"))
    if a.compare:
        got = np.load(a.compare).astype(np.float64)
        ref = np.array(vectors)
        if got.shape != ref.shape:
            sys.exit(f"st_reference: {a.compare} is {got.shape}, the reference {ref.shape}")
        cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
        i = int(cos.argmin())
        print(f"st_reference: {len(texts)} texts, minimum cosine {cos[i]:.15f} "
              f"(1 - {1 - cos[i]:.2e}) at text {i} ({len(ids[i])} tokens); "
              f"median 1 - {np.median(1 - cos):.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
