#!/usr/bin/env python3
"""Sentences/s of `coexec serve --model DIR` against onnxruntime's CPU
provider on the same cores and sentences, side by side in one run
(rounds alternate: coexec, then onnxruntime, each both ways).

    PY=$(scripts/embed_venv.sh | tail -1); MODEL=$(scripts/fetch_model.sh | tail -1)
    $PY scripts/bert_onnx.py --model $MODEL --output target/embed/model.onnx
    $PY scripts/embed_vs_ort.py --model $MODEL --onnx target/embed/model.onnx \\
        --coexec target/release/coexec --rounds 5 [--json OUT.json]

coexec: the service on 127.0.0.1 (`--devices cpu`, every core), clients
POSTing /embed with batches of --batch texts, --clients at a time, closed
loop, one pass over the file per round; timed from the first request to the
last answer, so HTTP, JSON and tokenising are in coexec's time and not in
onnxruntime's (which is timed on session.run alone, in process).
Two ways, as ort_embed_bench.py: `file` (batches in file order) and
`sorted` (the texts sorted by token count first, its best case). The
figures are medians over rounds, and each ratio is coexec over onnxruntime.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ort_embed_bench as ob  # noqa: E402


def die(msg):
    print(f"embed_vs_ort: {msg}", file=sys.stderr)
    sys.exit(2)


def post(url, body):
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, r.read()


def coexec_pass(url, batches, clients):
    """Seconds for `clients` closed-loop clients to send every batch."""
    todo = list(range(len(batches)))
    lock = threading.Lock()
    errors = []

    def client():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            status, _ = post(url, batches[i])
            if status != 200:
                errors.append(status)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=client) for _ in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        die(f"{len(errors)} requests failed: {errors[:5]}")
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--onnx", required=True)
    p.add_argument("--coexec", default="target/release/coexec")
    p.add_argument("--input", default="tests/data/embed_sentences.jsonl")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json")
    a = p.parse_args()
    for f in (a.model, a.onnx, a.coexec, a.input):
        if not os.path.exists(f):
            die(f"{f}: no such file or folder")
    texts = [json.loads(l)["text"] for l in open(a.input, encoding="utf-8") if l.strip()]
    tok = ob.load_tokenizer(a.model, ob.max_seq_length(a.model, ob.read_json(os.path.join(a.model, "config.json"))))
    lengths = [len(ob.encode(tok, t)) for t in texts]
    orders = {"file": list(range(len(texts))), "sorted": sorted(range(len(texts)), key=lambda i: lengths[i])}
    bodies = {m: [json.dumps({"inputs": [texts[i] for i in o[k:k + a.batch]]}).encode()
                  for k in range(0, len(o), a.batch)] for m, o in orders.items()}
    srv = subprocess.Popen([a.coexec, "serve", "--model", a.model, "--devices", "cpu", "--addr", "127.0.0.1:0"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = srv.stdout.readline()
        if not line.startswith("listening on "):
            die(f"coexec serve did not start: {line!r}")
        url = line.split()[-1] + "/embed"
        res = {"texts": len(texts), "tokens": sum(lengths), "batch": a.batch, "clients": a.clients,
               "threads": a.threads, "cpu": ob.cpu_name(), "rounds": []}
        # Warm-up: the profile learns both classes' speeds, ORT its session.
        for m in orders:
            coexec_pass(url, bodies[m], a.clients)
        for r in range(a.rounds):
            row = {}
            for m in orders:
                row[f"coexec_{m}"] = len(texts) / coexec_pass(url, bodies[m], a.clients)
            o = ob.bench(a.model, a.onnx, texts, batch=a.batch, threads=a.threads, seconds=0, min_passes=1)
            for m in orders:
                row[f"ort_{m}"] = o["modes"][m]["sentences_per_s"] if "modes" in o else o[m]["sentences_per_s"]
            res["rounds"].append(row)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v:.1f}/s" for k, v in row.items()), file=sys.stderr)
    finally:
        srv.terminate()
        srv.wait(timeout=30)
    med = {k: statistics.median(r[k] for r in res["rounds"]) for k in res["rounds"][0]}
    res["median"] = med
    res["ratios"] = {
        "coexec_file_over_ort_file": med["coexec_file"] / med["ort_file"],
        "coexec_file_over_ort_sorted": med["coexec_file"] / med["ort_sorted"],
        "coexec_sorted_over_ort_sorted": med["coexec_sorted"] / med["ort_sorted"],
    }
    for k, v in med.items():
        print(f"{k:>14}: {v:8.1f} sentences/s (median of {a.rounds})")
    for k, v in res["ratios"].items():
        print(f"{k}: {v:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
