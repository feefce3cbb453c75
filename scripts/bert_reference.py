#!/usr/bin/env python3
"""fp64 NumPy reference forward pass of a BERT sentence encoder
(all-MiniLM-L6-v2), written from scratch from the safetensors file, to check
coexec's embedding service and the ONNX graph against.

    PY=$(scripts/embed_venv.sh | tail -1); MODEL=$(scripts/fetch_model.sh | tail -1)
    $PY scripts/bert_reference.py --model $MODEL --input tests/data/embed_sentences.jsonl --output ref.json
    $PY scripts/bert_reference.py --model $MODEL --texts "A man is eating food." "The girl is carrying a baby."

Nothing here is shared with the production code: the safetensors file is
parsed by hand (8-byte little-endian header length, JSON header, raw
little-endian tensors), widths, depth, heads, eps and vocabulary come from
config.json, pooling from 1_Pooling/config.json, the sequence limit from
sentence_bert_config.json. Tokens come from tokenizer.json through the
`tokenizers` package, but as sentence-transformers tokenizes (not as the
file's own settings, truncation 128 and fixed padding 128): each text alone,
stripped, truncated to max_seq_length tokens including [CLS]/[SEP], no
padding. Then, in float64: word + position + token type 0 embeddings,
LayerNorm; per layer, Q/K/V, softmax(QK^T/sqrt(d)) V per head, output dense,
residual, LayerNorm, intermediate dense, exact GELU x/2 (1 + erf(x/sqrt 2))
(libm's erf, element by element: NumPy has none), output dense, residual,
LayerNorm; then pooling over the tokens and L2 normalisation.

--input FILE.jsonl: one text a line, as {"text": ...} or a bare JSON string.
--output OUT.json: {"model_sha256", settings, "items": [{"index", "tokens",
"ids", "embedding" (L2-normalised), "pooled" (before normalisation)}]}, the
numbers as float64 (17 significant digits). --texts also prints the cosine
matrix (4 decimals). Misuse exits 2 with a one-line error.
"""

import argparse
import hashlib
import json
import math
import os
import struct
import sys
import time

import numpy as np

DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I64": "<i8", "I32": "<i4"}


def die(msg, code=2):
    prog = os.path.splitext(os.path.basename(sys.argv[0]))[0] or "bert_reference"
    print(f"{prog}: {msg}", file=sys.stderr)
    sys.exit(code)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def read_safetensors(path):
    """{name: ndarray} from a safetensors file, read by hand."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        die(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        die(f"{path}: header length {n} past the end of the file")
    header = json.loads(data[8:8 + n])
    body = memoryview(data)[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] not in DTYPES:
            die(f"{path}: {name}: dtype {t['dtype']} not handled")
        lo, hi = t["data_offsets"]
        a = np.frombuffer(body[lo:hi], dtype=DTYPES[t["dtype"]])
        if a.size != math.prod(t["shape"]):
            die(f"{path}: {name}: {a.size} elements for shape {t['shape']}")
        # "bert." prefixed exports (BertModel inside a head) name the same tensors.
        out[name.removeprefix("bert.")] = a.reshape(t["shape"])
    return out


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        die(f"{path}: {e.strerror}")
    except json.JSONDecodeError as e:
        die(f"{path}:{e.lineno}: not JSON ({e.msg})")


def pooling_mode(model_dir):
    """The one pooling mode 1_Pooling/config.json turns on (mean if absent)."""
    path = os.path.join(model_dir, "1_Pooling", "config.json")
    if not os.path.exists(path):
        return "mean_tokens"
    cfg = read_json(path)
    on = [k[len("pooling_mode_"):] for k, v in cfg.items() if k.startswith("pooling_mode_") and v]
    if len(on) != 1 or on[0] not in ("mean_tokens", "cls_token", "max_tokens", "mean_sqrt_len_tokens"):
        die(f"{path}: pooling modes {on}: exactly one of mean/cls/max/mean_sqrt_len expected")
    return on[0]


def max_seq_length(model_dir, cfg):
    path = os.path.join(model_dir, "sentence_bert_config.json")
    n = read_json(path).get("max_seq_length", 512) if os.path.exists(path) else 512
    return min(n, cfg["max_position_embeddings"])


def load_tokenizer(model_dir, max_len):
    """tokenizer.json, truncating at max_len tokens ([CLS]/[SEP] included), never padding."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=max_len)
    return tok


def encode(tok, text):
    # sentence-transformers strips each text before tokenizing.
    return tok.encode(text.strip()).ids


class Bert:
    """The encoder in float64, one text at a time (no padding, no mask)."""

    def __init__(self, model_dir):
        self.dir = model_dir
        self.cfg = read_json(os.path.join(model_dir, "config.json"))
        c = self.cfg
        if c.get("hidden_act", "gelu") != "gelu" or c.get("position_embedding_type", "absolute") != "absolute":
            die(f"{model_dir}/config.json: only erf GELU and absolute positions are handled")
        self.path = os.path.join(model_dir, "model.safetensors")
        self.sha256 = sha256_file(self.path)
        raw = read_safetensors(self.path)
        self.w = {k: v.astype(np.float64) for k, v in raw.items() if v.dtype.kind == "f"}
        self.heads, self.layers = c["num_attention_heads"], c["num_hidden_layers"]
        self.eps = c["layer_norm_eps"]
        self.pooling = pooling_mode(model_dir)
        self.max_len = max_seq_length(model_dir, c)
        self.tok = load_tokenizer(model_dir, self.max_len)
        want = self.w["embeddings.word_embeddings.weight"].shape
        if want != (c["vocab_size"], c["hidden_size"]):
            die(f"{self.path}: word embeddings {want}, config says {(c['vocab_size'], c['hidden_size'])}")

    def ln(self, x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.eps) * self.w[name + ".weight"] + self.w[name + ".bias"]

    def dense(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def hidden(self, ids):
        """The last layer's token vectors, [n, hidden]."""
        w, n = self.w, len(ids)
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:n]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = self.ln(x, "embeddings.LayerNorm")
        h = self.heads
        d = x.shape[1] // h
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            q, k, v = (self.dense(x, p + "attention.self." + m).reshape(n, h, d).transpose(1, 0, 2)
                       for m in ("query", "key", "value"))
            s = q @ k.transpose(0, 2, 1) / math.sqrt(d)            # [h, n, n]
            s = np.exp(s - s.max(-1, keepdims=True))
            ctx = (s / s.sum(-1, keepdims=True)) @ v               # [h, n, d]
            a = self.dense(ctx.transpose(1, 0, 2).reshape(n, h * d), p + "attention.output.dense")
            x = self.ln(a + x, p + "attention.output.LayerNorm")
            u = self.dense(x, p + "intermediate.dense")
            erf = np.fromiter(map(math.erf, (u / math.sqrt(2)).ravel().tolist()), np.float64, u.size)
            g = 0.5 * u * (1 + erf.reshape(u.shape))
            x = self.ln(self.dense(g, p + "output.dense") + x, p + "output.LayerNorm")
        return x

    def embed(self, text):
        """(ids, pooled, normalised) for one text."""
        ids = encode(self.tok, text)
        x = self.hidden(ids)
        if self.pooling == "mean_tokens":
            pooled = x.sum(0) / max(len(ids), 1e-9)
        elif self.pooling == "mean_sqrt_len_tokens":
            pooled = x.sum(0) / math.sqrt(len(ids))
        elif self.pooling == "max_tokens":
            pooled = x.max(0)
        else:
            pooled = x[0]
        return ids, pooled, pooled / max(np.linalg.norm(pooled), 1e-12)


def read_texts(path):
    """The texts of a .jsonl file: {"text": ...} objects or bare strings, one a line."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        die(f"{path}: {e.strerror}")
    texts = []
    for i, line in enumerate(lines, 1):
        try:
            v = json.loads(line)
        except json.JSONDecodeError as e:
            die(f"{path}:{i}: not JSON ({e.msg})")
        if isinstance(v, dict):
            v = v.get("text")
        if not isinstance(v, str):
            die(f"{path}:{i}: neither a string nor an object with a string \"text\"")
        texts.append(v)
    return texts


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="folder of model.safetensors, config.json, tokenizer.json")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", help="FILE.jsonl, one text a line")
    src.add_argument("--texts", nargs="+", help="texts on the command line; prints their cosine matrix")
    p.add_argument("--output", help="OUT.json (required with --input)")
    p.add_argument("--limit", type=int, help="only the first N texts")
    a = p.parse_args()
    if a.input and not a.output:
        die("--input needs --output")
    if not os.path.isfile(os.path.join(a.model, "model.safetensors")):
        die(f"{a.model}: no model.safetensors (scripts/fetch_model.sh fetches it)")
    texts = read_texts(a.input) if a.input else a.texts
    if a.limit is not None:
        texts = texts[:a.limit]
    bert = Bert(a.model)
    items, t0 = [], time.monotonic()
    for i, text in enumerate(texts):
        ids, pooled, emb = bert.embed(text)
        items.append({"index": i, "tokens": len(ids), "ids": ids,
                      "embedding": emb.tolist(), "pooled": pooled.tolist()})
        if a.input and (i + 1) % 50 == 0:
            print(f"bert_reference: {i + 1}/{len(texts)} in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    if a.output:
        import tokenizers
        out = {"model_sha256": bert.sha256, "model": os.path.abspath(a.model), "dtype": "float64",
               "max_seq_length": bert.max_len, "pooling": bert.pooling, "normalize": "l2",
               "tokenizer": f"tokenizers {tokenizers.__version__}, truncation {bert.max_len}, no padding",
               "numpy": np.__version__, "input": a.input, "items": items}
        with open(a.output, "w") as f:
            json.dump(out, f)
        print(f"bert_reference: {len(items)} embeddings into {a.output} "
              f"({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    if a.texts:
        e = np.array([it["embedding"] for it in items])
        for row in e @ e.T:
            print(" ".join(f"{v:.4f}" for v in row))


if __name__ == "__main__":
    main()
