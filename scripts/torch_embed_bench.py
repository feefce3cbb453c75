#!/usr/bin/env python3
"""PyTorch on the GPU as the reference for the speed of coexec's GPU path:
the same BERT encoder (all-MiniLM-L6-v2 or any of its layout) written in
plain torch from model.safetensors and config.json, FP32 with TF32 off
(coexec's cuBLAS math), over pre-tokenised ids, at its best case: sequences
sorted by length, then padded batches with an attention mask
(scaled_dot_product_attention).

    python3 scripts/torch_embed_bench.py --model DIR --ids ids.jsonl \\
        --count 10000 --reference reference.npy

--ids holds one JSON list of token ids per line (scripts/gpu_model_pack.py
writes it from the fp64 reference); --count cycles them to that many
sequences (the 10 000-line corpus of `coexec embed`'s figure). Tokenising
is not timed (the GPU machine has no tokenizers package; coexec's figure
includes it). Each round copies the ids in and the vectors out. Prints one
JSON line: texts/s and tokens/s per round and their median, and the min
cosine of the first len(reference) vectors against the fp64 reference.
Needs torch and numpy (both on the GPU machine).
"""

import argparse
import json
import os
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


def load(model_dir, device):
    """The F32 tensors of model.safetensors on `device`, `bert.` prefix dropped."""
    path = os.path.join(model_dir, "model.safetensors")
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            continue  # e.g. embeddings.position_ids (I64): not a weight
        lo, hi = info["data_offsets"]
        a = np.frombuffer(raw, dtype="<f4", count=(hi - lo) // 4, offset=8 + n + lo)
        key = name[5:] if name.startswith("bert.") else name
        out[key] = torch.from_numpy(a.reshape(info["shape"]).copy()).to(device)
    return out


class Bert:
    def __init__(self, model_dir, device):
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        self.h, self.heads = c["hidden_size"], c["num_attention_heads"]
        self.layers, self.eps = c["num_hidden_layers"], c.get("layer_norm_eps", 1e-12)
        self.w = load(model_dir, device)
        self.pos_type = (
            self.w["embeddings.position_embeddings.weight"]
            + self.w["embeddings.token_type_embeddings.weight"][0]
        )

    def ln(self, x, name):
        return F.layer_norm(x, (self.h,), self.w[name + ".weight"], self.w[name + ".bias"], self.eps)

    def dense(self, x, name):
        return F.linear(x, self.w[name + ".weight"], self.w[name + ".bias"])

    @torch.inference_mode()
    def __call__(self, ids, mask):
        b, length = ids.shape
        d = self.h // self.heads
        x = self.w["embeddings.word_embeddings.weight"][ids] + self.pos_type[:length]
        x = self.ln(x, "embeddings.LayerNorm")
        keep = mask[:, None, None, :]
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            split = lambda t: t.view(b, length, self.heads, d).transpose(1, 2)  # noqa: E731
            q = split(self.dense(x, p + "attention.self.query"))
            k = split(self.dense(x, p + "attention.self.key"))
            v = split(self.dense(x, p + "attention.self.value"))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
            a = a.transpose(1, 2).reshape(b, length, self.h)
            x = self.ln(x + self.dense(a, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            u = F.gelu(self.dense(x, p + "intermediate.dense"))
            x = self.ln(x + self.dense(u, p + "output.dense"), p + "output.LayerNorm")
        m = mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * m).sum(1) / m.sum(1)
        return F.normalize(pooled, dim=-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--count", type=int, default=10000)
    ap.add_argument("--batch", type=int, default=256, help="sequences per padded batch")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reference")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA device for torch")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    with open(a.ids) as f:
        base = [json.loads(line) for line in f if line.strip()]
    seqs = [base[i % len(base)] for i in range(a.count)]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    batches = []
    for s in range(0, len(order), a.batch):
        idx = order[s : s + a.batch]
        length = max(len(seqs[i]) for i in idx)
        ids = np.zeros((len(idx), length), dtype=np.int64)
        mask = np.zeros((len(idx), length), dtype=bool)
        for r, i in enumerate(idx):
            ids[r, : len(seqs[i])] = seqs[i]
            mask[r, : len(seqs[i])] = True
        batches.append((idx, torch.from_numpy(ids).pin_memory(), torch.from_numpy(mask).pin_memory()))
    model = Bert(a.model, dev)
    tokens = sum(len(s) for s in seqs)

    def run():
        out = np.empty((len(seqs), model.h), dtype=np.float32)
        for idx, ids, mask in batches:
            v = model(ids.to(dev, non_blocking=True), mask.to(dev, non_blocking=True))
            out[idx] = v.cpu().numpy()
        return out

    run()  # warm-up: kernels chosen and loaded, memory pool grown
    rounds = []
    for _ in range(a.rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = run()
        torch.cuda.synchronize()
        rounds.append(time.perf_counter() - t)
    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "sequences": len(seqs),
        "tokens": tokens,
        "batch": a.batch,
        "seconds": rounds,
        "texts_per_s": [len(seqs) / s for s in rounds],
        "median_texts_per_s": len(seqs) / statistics.median(rounds),
        "median_tokens_per_s": tokens / statistics.median(rounds),
    }
    if a.reference:
        ref = np.load(a.reference)
        got = out[: len(ref)].astype(np.float64)
        cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
        report["min_cosine_vs_fp64"] = float(cos.min())
    print(json.dumps(report))


if __name__ == "__main__":
    main()
