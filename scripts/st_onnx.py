#!/usr/bin/env python3
"""A sentence-transformers folder as an ONNX graph for onnxruntime's CPU
provider: input_ids and attention_mask ([batch, tokens], int64) in,
sentence_embedding ([batch, dim], f32) out — the transformer, its Pooling
(mean over the mask, or the first token) and Normalize where modules.json
has it — exported by torch.onnx (opset 17), the graph
scripts/ort_embed_bench.py and scripts/embed_vs_ort.py time.

    $PY scripts/st_onnx.py --model DIR --output target/embed/mpnet.onnx

For BERT folders scripts/bert_onnx.py writes the graph from the weights
alone; this one needs torch and transformers (any family they load).
"""

import argparse
import json
import os
import sys

import torch
from transformers import AutoModel


class Encoder(torch.nn.Module):
    def __init__(self, model, pooling, normalize):
        super().__init__()
        self.model, self.pooling, self.normalize = model, pooling, normalize

    def forward(self, input_ids, attention_mask):
        h = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.pooling == "cls":
            v = h[:, 0]
        else:
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            v = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        if self.normalize:
            v = torch.nn.functional.normalize(v, p=2, dim=1)
        return v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--output", required=True)
    a = ap.parse_args()
    mods = json.load(open(os.path.join(a.model, "modules.json")))
    kinds = [m["type"].rsplit(".", 1)[-1] for m in mods]
    pool_cfg = json.load(open(os.path.join(a.model, "1_Pooling", "config.json")))
    pooling = "cls" if pool_cfg.get("pooling_mode_cls_token") else "mean"
    if set(kinds) - {"Transformer", "Pooling", "Normalize"}:
        sys.exit(f"st_onnx: modules {kinds}: only Transformer, Pooling and Normalize are exported")
    model = AutoModel.from_pretrained(a.model, dtype=torch.float32).eval()
    enc = Encoder(model, pooling, "Normalize" in kinds).eval()
    ids = torch.ones((2, 16), dtype=torch.long)
    mask = torch.ones((2, 16), dtype=torch.long)
    os.makedirs(os.path.dirname(os.path.abspath(a.output)), exist_ok=True)
    batch, tokens = torch.export.Dim("batch"), torch.export.Dim("tokens", max=4096)
    torch.onnx.export(enc, (ids, mask), a.output, input_names=["input_ids", "attention_mask"],
                      output_names=["sentence_embedding"], opset_version=17, dynamo=True,
                      dynamic_shapes={"input_ids": {0: batch, 1: tokens},
                                      "attention_mask": {0: batch, 1: tokens}},
                      external_data=False)
    print(f"st_onnx: {a.output} ({os.path.getsize(a.output) >> 20} MiB, pooling {pooling}, "
          f"normalize {'Normalize' in kinds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
