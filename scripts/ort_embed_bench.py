#!/usr/bin/env python3
"""Sentences per second of onnxruntime on the CPU for a BERT sentence encoder
(bert_onnx.py's graph), the baseline coexec's embedding service is held to.

    PY=$(scripts/embed_venv.sh | tail -1); MODEL=$(scripts/fetch_model.sh | tail -1)
    $PY scripts/ort_embed_bench.py --model $MODEL --onnx target/embed/model.onnx \\
        --input tests/data/embed_sentences.jsonl --batch 32 --threads 2 --seconds 120 [--json OUT.json]

CPUExecutionProvider, fp32, intra-op threads = --threads, inter-op 1, all
graph optimisations. The texts are tokenized once beforehand as
bert_reference.py does (truncation at max_seq_length, no padding), and only
session.run is timed; the tokenizer's own rate (one thread, encode one text
at a time) is reported beside it. Two ways to batch:

  file    batches of --batch in file order, each padded to its longest (what
          a server sees when requests arrive in that order);
  sorted  all texts sorted by token count first, then batched (padding
          nearly nil: the best case).

One pass runs every batch once. After a warm-up pass of each (which also
checks that both orders give the same embeddings), passes alternate between
the modes until --seconds have gone by (at least --min-passes each); the
figure per mode is the median over its passes of texts / pass time (the
best pass is kept too: on a machine shared with a build, noise only slows).

Importable: bench(...) returns the figures as a dict (what --json writes).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

from bert_onnx import pad, session
from bert_reference import die, encode, load_tokenizer, max_seq_length, read_json, read_texts

MODES = ("file", "sorted")


def batches(token_ids, order, batch):
    """Padded (ids, mask) arrays, and the real and padded token counts, for
    the texts in `order` taken `batch` at a time."""
    out, real, padded = [], 0, 0
    for lo in range(0, len(order), batch):
        part = [token_ids[i] for i in order[lo:lo + batch]]
        ids, mask = pad(part)
        out.append((order[lo:lo + batch], ids, mask))
        real += int(mask.sum())
        padded += mask.size
    return out, real, padded


def run_pass(sess, prepared):
    t0 = time.perf_counter()
    outs = [sess.run(["sentence_embedding"], {"input_ids": ids, "attention_mask": mask})[0]
            for _, ids, mask in prepared]
    return time.perf_counter() - t0, outs


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def loadavg():
    """The 1-minute load average (other work on the machine skews the figures)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def bench(model_dir, onnx_path, texts, batch=32, threads=0, seconds=60.0, min_passes=3, log=None):
    """Median sentences/s of onnxruntime per mode; see the module's doc."""
    import onnxruntime as ort
    say = log or (lambda msg: None)
    load_before = loadavg()
    tok = load_tokenizer(model_dir, max_seq_length(model_dir, read_json(os.path.join(model_dir, "config.json"))))
    t0 = time.perf_counter()
    token_ids = [encode(tok, t) for t in texts]
    tok_s = time.perf_counter() - t0
    lengths = [len(t) for t in token_ids]
    orders = {"file": list(range(len(texts))),
              "sorted": sorted(range(len(texts)), key=lambda i: lengths[i])}
    prepared, padding = {}, {}
    for mode in MODES:
        prepared[mode], real, padded = batches(token_ids, orders[mode], batch)
        padding[mode] = {"real_tokens": real, "padded_tokens": padded, "fill": real / padded}
    sess = session(onnx_path, threads)

    # Warm-up, and the same embedding for a text whichever batch it was padded in.
    emb = {}
    for mode in MODES:
        took, outs = run_pass(sess, prepared[mode])
        e = np.zeros((len(texts), outs[0].shape[1]))
        for (idx, _, _), o in zip(prepared[mode], outs):
            e[idx] = o
        emb[mode] = e
        say(f"warm-up {mode}: {took:.2f} s")
    cos_min = float((emb["file"] * emb["sorted"]).sum(1).min())

    passes = {m: [] for m in MODES}
    start = time.perf_counter()
    while (time.perf_counter() - start < seconds) or min(len(v) for v in passes.values()) < min_passes:
        for mode in MODES:
            took, _ = run_pass(sess, prepared[mode])
            passes[mode].append(took)
            say(f"{mode} pass {len(passes[mode])}: {took:.2f} s, {len(texts) / took:.1f} sentences/s")
    res = {
        "onnx": os.path.abspath(onnx_path), "model": os.path.abspath(model_dir),
        "texts": len(texts), "batch": batch, "threads": threads, "inter_op_threads": 1,
        "graph_optimization": "ORT_ENABLE_ALL", "provider": "CPUExecutionProvider",
        "tokens": {"total": sum(lengths), "max": max(lengths), "mean": sum(lengths) / len(lengths)},
        "tokenizer_sentences_per_s": len(texts) / tok_s,
        "file_vs_sorted_min_cosine": cos_min,
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "onnxruntime": ort.__version__, "numpy": np.__version__,
                    "loadavg_1min_before": load_before, "loadavg_1min_after": loadavg()},
        "modes": {},
    }
    for mode in MODES:
        rates = [len(texts) / s for s in passes[mode]]
        res["modes"][mode] = {"sentences_per_s": statistics.median(rates), "best_sentences_per_s": max(rates),
                              "passes": len(rates),
                              "pass_s": passes[mode], "rates": rates, **padding[mode],
                              "real_tokens_per_s": statistics.median(rates) * padding[mode]["real_tokens"] / len(texts)}
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="model folder (tokenizer.json, configs)")
    p.add_argument("--onnx", required=True, help="bert_onnx.py's graph")
    p.add_argument("--input", required=True, help="FILE.jsonl, one text a line")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="intra-op threads")
    p.add_argument("--seconds", type=float, default=60.0, help="time to keep repeating passes")
    p.add_argument("--min-passes", type=int, default=3)
    p.add_argument("--json", metavar="FILE", help="also write the figures here")
    p.add_argument("--quiet", action="store_true", help="no line per pass")
    a = p.parse_args()
    if a.batch < 1 or a.threads < 1 or a.min_passes < 1 or a.seconds < 0:
        die("--batch, --threads and --min-passes must be at least 1, --seconds not negative")
    for path in (a.onnx, a.input, os.path.join(a.model, "tokenizer.json")):
        if not os.path.isfile(path):
            die(f"{path}: no such file")
    texts = read_texts(a.input)
    if not texts:
        die(f"{a.input}: no texts")
    log = None if a.quiet else (lambda m: print(f"ort_embed_bench: {m}", file=sys.stderr))
    r = bench(a.model, a.onnx, texts, a.batch, a.threads, a.seconds, a.min_passes, log)
    r["input"] = a.input
    print(f"onnxruntime {r['machine']['onnxruntime']} CPU, {r['threads']} intra-op threads, batch {a.batch}, "
          f"{r['texts']} texts ({r['tokens']['total']} tokens, max {r['tokens']['max']}), {r['machine']['cpu']}")
    for mode, m in r["modes"].items():
        print(f"  {mode:6s} {m['sentences_per_s']:8.1f} sentences/s  (median of {m['passes']} passes, "
              f"slowest-best {min(m['rates']):.1f}-{max(m['rates']):.1f}; padding fill {m['fill']:.0%}, "
              f"{m['real_tokens_per_s']:.0f} real tokens/s)")
    print(f"  tokenizer alone {r['tokenizer_sentences_per_s']:.0f} sentences/s (one thread); "
          f"file vs sorted embeddings min cosine {r['file_vs_sorted_min_cosine']:.7f}")
    print(f"  load average (1 min) {r['machine']['loadavg_1min_before']:.2f} before, "
          f"{r['machine']['loadavg_1min_after']:.2f} after (the bench adds about {r['threads']}; "
          f"more means other work shared the cores)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
