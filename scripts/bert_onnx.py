#!/usr/bin/env python3
"""Builds an fp32 ONNX graph of the BERT sentence encoder (all-MiniLM-L6-v2)
from its safetensors file with the `onnx` helper API, as a baseline for
coexec's own forward pass (onnxruntime on the same weights).

    PY=$(scripts/embed_venv.sh | tail -1); MODEL=$(scripts/fetch_model.sh | tail -1)
    $PY scripts/bert_onnx.py --model $MODEL --output target/embed/model.onnx
    $PY scripts/bert_onnx.py --model $MODEL --output target/embed/model.onnx --verify ref.json

Inputs input_ids and attention_mask, int64 [batch, seq]; output
sentence_embedding, float [batch, hidden]: the mean of the last layer's
vectors over the unmasked tokens, L2-normalised. Token types are all 0 (the
row is folded into the position table); position ids are an exclusive
CumSum of ones shaped like input_ids, which keeps [batch, seq, hidden] known
to shape inference (SkipLayerNormalization's fusion compares shapes). The
graph is laid out as the transformers exporter writes BERT, so that
onnxruntime's optimizer finds its usual patterns: MatMul + Add per projection; Reshape [0,0,heads,d]
and Transpose for the heads (key transposed 0,2,3,1); MatMul, Div by sqrt(d),
Add of the mask (attention_mask -> Unsqueeze -> Unsqueeze -> Cast -> 1 - m ->
* -10000), Softmax, MatMul, Transpose, Reshape [0,0,hidden]; Add residual +
LayerNormalization; GELU as x * 0.5 * (1 + Erf(x / sqrt 2)).

--opset 17 (the default) uses ONNX's LayerNormalization and passes the ONNX
checker; onnxruntime 1.32 fuses SkipLayerNormalization and BiasGelu in it,
but not Attention: that matcher only accepts the Add/Reshape versions of
opsets <= 13 and Unsqueeze with an axes attribute (<= 12). --opset 12 writes
that older form, LayerNormalization then being onnxruntime's own operator
(no ONNX schema before 17, so no checker), and gets Attention fused.

--verify REF.json (bert_reference.py's output) runs the graph in
onnxruntime (CPU, all graph optimisations) on the reference's own token ids,
in batches of --batch in file order, each padded to its longest, and prints
the minimum cosine to the fp64 embeddings; exit 1 below --min-cosine.
--optimized FILE also writes the graph onnxruntime ran, and prints its
operator counts (which fusions happened).
"""

import argparse
import json
import math
import os
import sys
from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bert_reference import die, pooling_mode, read_json, read_safetensors, sha256_file

OPSET = 17


class Graph:
    def __init__(self, opset):
        self.nodes, self.inits, self.n, self.opset = [], [], 0, opset

    def const(self, name, array):
        if name not in {t.name for t in self.inits}:
            self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type, inputs, name=None, **attrs):
        self.n += 1
        out = name or f"{op_type}_{self.n}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"{op_type}_{self.n}", **attrs))
        return out

    # Before opset 13 Unsqueeze and ReduceSum take their axes as an attribute.
    def unsqueeze(self, x, axis):
        if self.opset < 13:
            return self.op("Unsqueeze", [x], axes=[axis])
        return self.op("Unsqueeze", [x, self.const(f"axis_{axis}", np.array([axis], dtype=np.int64))])

    def reduce_sum(self, x, axis, keepdims):
        if self.opset < 13:
            return self.op("ReduceSum", [x], axes=[axis], keepdims=keepdims)
        return self.op("ReduceSum", [x, self.const(f"axis_{axis}", np.array([axis], dtype=np.int64))],
                       keepdims=keepdims)


def build(model_dir, opset=OPSET):
    cfg = read_json(os.path.join(model_dir, "config.json"))
    if pooling_mode(model_dir) != "mean_tokens":
        die(f"{model_dir}: only mean pooling is built")
    w = {k: v.astype(np.float32) for k, v in read_safetensors(os.path.join(model_dir, "model.safetensors")).items()
         if v.dtype.kind == "f"}
    hid, heads, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["layer_norm_eps"]
    d = hid // heads
    g = Graph(opset)
    i64 = lambda *v: np.array(v, dtype=np.int64)
    f32 = lambda v: np.array(v, dtype=np.float32)

    def dense(x, name, wname):
        wt = g.const(wname + ".weight", np.ascontiguousarray(w[wname + ".weight"].T))
        b = g.const(wname + ".bias", w[wname + ".bias"])
        return g.op("Add", [g.op("MatMul", [x, wt]), b], name)

    def layernorm(x, wname, name=None):
        return g.op("LayerNormalization", [x, g.const(wname + ".weight", w[wname + ".weight"]),
                                           g.const(wname + ".bias", w[wname + ".bias"])],
                    name, axis=-1, epsilon=eps)

    # Embeddings: word + (position + token type 0), LayerNorm.
    word = g.const("embeddings.word_embeddings.weight", w["embeddings.word_embeddings.weight"])
    pos = g.const("embeddings.position_embeddings.weight",
                  w["embeddings.position_embeddings.weight"] + w["embeddings.token_type_embeddings.weight"][0])
    # Position ids 0..seq-1 as an exclusive CumSum of ones shaped like input_ids, so
    # that shape inference keeps [batch, seq, hidden] down the graph (a Slice of the
    # table by Shape would lose seq, and with it the fusions that compare shapes).
    ones = g.op("Add", [g.op("Mul", ["input_ids", g.const("zero_i", i64(0))]), g.const("one_i", i64(1))])
    pos_ids = g.op("CumSum", [ones, g.const("axis_seq", np.array(1, dtype=np.int64))], exclusive=1)
    x = g.op("Add", [g.op("Gather", [word, "input_ids"], axis=0), g.op("Gather", [pos, pos_ids], axis=0)])
    x = layernorm(x, "embeddings.LayerNorm")

    # Additive mask [b, 1, 1, s]: 0 on tokens, -10000 on padding.
    m = g.unsqueeze(g.unsqueeze("attention_mask", 1), 2)
    m = g.op("Cast", [m], to=TensorProto.FLOAT)
    m = g.op("Sub", [g.const("one_f", f32(1.0)), m])
    mask = g.op("Mul", [m, g.const("neg_10000", f32(-10000.0))])
    heads_shape = g.const("heads_shape", i64(0, 0, heads, d))
    merge_shape = g.const("merge_shape", i64(0, 0, hid))
    scale = g.const("sqrt_d", f32(math.sqrt(d)))
    sqrt2, half, one = g.const("sqrt2", f32(math.sqrt(2.0))), g.const("half", f32(0.5)), g.const("one_g", f32(1.0))

    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q = g.op("Transpose", [g.op("Reshape", [dense(x, None, p + "attention.self.query"), heads_shape])],
                 perm=[0, 2, 1, 3])
        k = g.op("Transpose", [g.op("Reshape", [dense(x, None, p + "attention.self.key"), heads_shape])],
                 perm=[0, 2, 3, 1])
        v = g.op("Transpose", [g.op("Reshape", [dense(x, None, p + "attention.self.value"), heads_shape])],
                 perm=[0, 2, 1, 3])
        s = g.op("Add", [g.op("Div", [g.op("MatMul", [q, k]), scale]), mask])
        ctx = g.op("MatMul", [g.op("Softmax", [s], axis=3), v])
        ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), merge_shape])
        a = dense(ctx, None, p + "attention.output.dense")
        x = layernorm(g.op("Add", [a, x]), p + "attention.output.LayerNorm")
        u = dense(x, None, p + "intermediate.dense")
        gelu = g.op("Mul", [g.op("Mul", [u, g.op("Add", [g.op("Erf", [g.op("Div", [u, sqrt2])]), one])]), half])
        o = dense(gelu, None, p + "output.dense")
        x = layernorm(g.op("Add", [o, x]), p + "output.LayerNorm", f"hidden_{i}")

    # Masked mean over tokens, then L2 normalisation (eps as sentence-transformers').
    mf = g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    summed = g.reduce_sum(g.op("Mul", [x, g.unsqueeze(mf, 2)]), 1, 0)
    count = g.op("Max", [g.reduce_sum(mf, 1, 1), g.const("eps_count", f32(1e-9))])
    mean = g.op("Div", [summed, count], "pooled")
    norm = g.op("Sqrt", [g.reduce_sum(g.op("Mul", [mean, mean]), 1, 1)])
    g.op("Div", [mean, g.op("Max", [norm, g.const("eps_norm", f32(1e-12))])], "sentence_embedding")

    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
              for n in ("input_ids", "attention_mask")]
    outputs = [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", hid])]
    graph = helper.make_graph(g.nodes, "bert_sentence_embedding", inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="coexec scripts/bert_onnx.py")
    model.ir_version = 8   # onnxruntime reads IR 8 at opset 17 on every recent release
    model.doc_string = f"model.safetensors sha256 {sha256_file(os.path.join(model_dir, 'model.safetensors'))}"
    if opset >= 17:   # before 17, LayerNormalization is onnxruntime's own (no ONNX schema)
        onnx.checker.check_model(model, full_check=True)
    return model


def session(path, threads=0, optimized=None):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    if optimized:
        so.optimized_model_filepath = optimized
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def pad(batch):
    """int64 ids and mask [len(batch), longest], zero-padded on the right."""
    n = max(len(ids) for ids in batch)
    ids = np.zeros((len(batch), n), dtype=np.int64)
    mask = np.zeros((len(batch), n), dtype=np.int64)
    for r, t in enumerate(batch):
        ids[r, :len(t)] = t
        mask[r, :len(t)] = 1
    return ids, mask


def verify(onnx_path, ref_path, batch, optimized):
    ref = read_json(ref_path)
    items = ref.get("items") if isinstance(ref, dict) else None
    if not items:
        die(f"{ref_path}: no `items` (not bert_reference.py's output)")
    sess = session(onnx_path, optimized=optimized)
    cos = []
    for lo in range(0, len(items), batch):
        part = items[lo:lo + batch]
        ids, mask = pad([it["ids"] for it in part])
        got = sess.run(["sentence_embedding"], {"input_ids": ids, "attention_mask": mask})[0].astype(np.float64)
        want = np.array([it["embedding"] for it in part])
        cos += list((got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1))
    cos = np.array(cos)
    worst = int(cos.argmin())
    print(f"bert_onnx: {len(cos)} texts vs {ref_path}, batches of {batch}: min cosine {cos.min():.9f} "
          f"(item {worst}, {items[worst]['tokens']} tokens), median {np.median(cos):.9f}, "
          f"max 1-cos {1 - cos.min():.2e}")
    if optimized:
        ops = Counter(n.op_type for n in onnx.load(optimized).graph.node)
        print("bert_onnx: ops after onnxruntime's optimisation: "
              + ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])))
    return cos.min()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="folder of model.safetensors and config.json")
    p.add_argument("--output", required=True, help="the .onnx file to write")
    p.add_argument("--verify", metavar="REF.json", help="bert_reference.py output to compare with")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--opset", type=int, default=OPSET, choices=(12, 17))
    p.add_argument("--min-cosine", type=float, default=0.99999)
    p.add_argument("--optimized", metavar="FILE", help="write onnxruntime's optimised graph here (with --verify)")
    a = p.parse_args()
    if a.batch < 1:
        die("--batch must be at least 1")
    if not os.path.isfile(os.path.join(a.model, "model.safetensors")):
        die(f"{a.model}: no model.safetensors (scripts/fetch_model.sh fetches it)")
    model = build(a.model, a.opset)
    os.makedirs(os.path.dirname(os.path.abspath(a.output)), exist_ok=True)
    onnx.save(model, a.output)
    print(f"bert_onnx: {len(model.graph.node)} nodes, {os.path.getsize(a.output) / 1e6:.1f} MB into {a.output}",
          file=sys.stderr)
    if a.verify and verify(a.output, a.verify, a.batch, a.optimized) < a.min_cosine:
        print(f"bert_onnx: min cosine below {a.min_cosine}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
