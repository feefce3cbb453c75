#!/usr/bin/env python3
"""Writes tests/data/families/: one tiny random model per encoder family
coexec serves, as Hugging Face `transformers` and `sentence-transformers`
save them, and beside each the reference embeddings of
sentence-transformers in float64 on the same weights.

    python3 scripts/make_tiny_families.py           # needs torch, transformers,
                                                    # sentence-transformers, tokenizers

Each folder: config.json, model.safetensors (or shards and
model.safetensors.index.json), tokenizer.json, modules.json with its
modules (1_Pooling, 2_Dense, 3_Normalize where the model has them),
sentence_bert_config.json, config_sentence_transformers.json (prompts)
and reference.json, in sentence-transformers 6's formats (`pooling_mode`,
the limit as tokenizer_config.json's `model_max_length`; the older
formats are tests/data/tiny-bert's and the real models'):

    {"family", "pooling", "dtype", "max_seq_length",
     "sentences": [...], "prompt": {"name", "text"} | null,
     "ids": [[...]], "vectors": [[...]]}

`ids` are the sentences' token ids (the prompt's text put first where a
prompt is named), truncated at max_seq_length, by the `tokenizers`
library from tokenizer.json: the library coexec's Rust tokenizer is.
`vectors` are SentenceTransformer(folder).double() on those ids, one
sentence at a time (no padding), through every module of modules.json.

The models (hidden 32, 2 layers of 4 heads, feed-forward 64) are seeded;
their vectors mean nothing. CI does not run this script: its outputs are
committed, and the Rust tests compare coexec's vectors with them
(tests/models/families.rs).
"""

import json
import os
import shutil
import sys

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordPiece
from tokenizers.processors import TemplateProcessing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests/data/families")
BERT_TOKENIZER = os.path.join(ROOT, "tests/data/tiny-bert/tokenizer.json")
SENTENCES = os.path.join(ROOT, "tests/data/embed_sentences.jsonl")
N_SENTENCES = 48
SEED = 20261202

H, LAYERS, HEADS, FF = 32, 2, 4, 64


def sentences():
    """The corpus's first sentences of each length class: short, mixed
    script, and long ones past every model's limit."""
    lines = [json.loads(l)["text"] for l in open(SENTENCES, encoding="utf-8")]
    lines = [t for t in lines if t.strip()]
    by_len = sorted(lines, key=len)
    step = max(1, len(by_len) // N_SENTENCES)
    return by_len[::step][:N_SENTENCES]


def bert_tokenizer():
    return Tokenizer.from_file(BERT_TOKENIZER)


def roberta_tokenizer():
    """tiny-bert's WordPiece vocabulary renumbered as RoBERTa's: <s> 0,
    <pad> 1, </s> 2, <unk> 3 (so that no text token has the padding id,
    from which RoBERTa counts positions)."""
    base = json.load(open(BERT_TOKENIZER, encoding="utf-8"))
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    rest = [t for t, _ in sorted(base["model"]["vocab"].items(), key=lambda kv: kv[1])
            if not t.startswith("[")]
    vocab = {t: i for i, t in enumerate(specials + rest)}
    tok = Tokenizer(WordPiece(vocab, unk_token="<unk>", continuing_subword_prefix="##"))
    full = bert_tokenizer()
    tok.normalizer = full.normalizer
    tok.pre_tokenizer = full.pre_tokenizer
    tok.decoder = full.decoder
    tok.post_processor = TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)])
    for i, t in enumerate(specials):
        tok.add_special_tokens([t])
    return tok


# name: (transformers config class, model class, config kwargs, tokenizer,
#        pooling mode, extra modules, dtype, shard, prompts)
def families():
    from transformers import (BertConfig, BertModel, CamembertConfig, CamembertModel,
                              DistilBertConfig, DistilBertModel, GteConfig, GteModel,
                              ModernBertConfig, NomicBertConfig, NomicBertModel,
                              ModernBertModel, MPNetConfig, MPNetModel, Qwen3Config,
                              Qwen3Model, RobertaConfig, RobertaModel, XLMRobertaConfig,
                              XLMRobertaModel)
    nb = len(json.load(open(BERT_TOKENIZER))["model"]["vocab"])
    bt = bert_tokenizer()
    cls, sep = bt.token_to_id("[CLS]"), bt.token_to_id("[SEP]")
    nr = nb  # the renumbered vocabulary has as many entries
    common = dict(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  intermediate_size=FF)
    return {
        "bert-cls-dense": (BertConfig, BertModel,
                           dict(common, vocab_size=nb, max_position_embeddings=72,
                                type_vocab_size=2, hidden_act="gelu"),
                           bert_tokenizer, "cls", ["dense", "normalize"], "float32", False,
                           {"query": "query: ", "passage": "passage: "}),
        "bert-f16": (BertConfig, BertModel,
                     dict(common, vocab_size=nb, max_position_embeddings=72),
                     bert_tokenizer, "mean", [], "float16", False, {}),
        "bert-bf16": (BertConfig, BertModel,
                      dict(common, vocab_size=nb, max_position_embeddings=72),
                      bert_tokenizer, "mean", [], "bfloat16", False, {}),
        "roberta-lasttoken": (RobertaConfig, RobertaModel,
                              dict(common, vocab_size=nr, max_position_embeddings=74,
                                   pad_token_id=1, type_vocab_size=1,
                                   hidden_act="gelu_new"),
                              roberta_tokenizer, "lasttoken", [], "float32", False, {}),
        "xlm-roberta-sharded": (XLMRobertaConfig, XLMRobertaModel,
                                dict(common, vocab_size=nr, max_position_embeddings=74,
                                     pad_token_id=1, type_vocab_size=1),
                                roberta_tokenizer, "mean", ["normalize"], "float32", True, {}),
        "camembert-sqrt": (CamembertConfig, CamembertModel,
                           dict(common, vocab_size=nr, max_position_embeddings=74,
                                pad_token_id=1, type_vocab_size=1),
                           roberta_tokenizer, "mean_sqrt_len_tokens", [], "float32", False, {}),
        "distilbert-max": (DistilBertConfig, DistilBertModel,
                           dict(vocab_size=nb, dim=H, n_layers=LAYERS, n_heads=HEADS,
                                hidden_dim=FF, max_position_embeddings=72, activation="gelu"),
                           bert_tokenizer, "max", [], "float32", False, {}),
        # Positions past 128 reach MPNet's last relative-distance buckets.
        "mpnet-mean": (MPNetConfig, MPNetModel,
                       dict(common, vocab_size=nr, max_position_embeddings=202,
                            pad_token_id=1, relative_attention_num_buckets=32),
                       roberta_tokenizer, "mean", ["normalize"], "float32", False, {}),
        # Three layers: global, local (keys within 8 positions), global; the
        # texts past 17 tokens reach past the window.
        "modernbert-mean": (ModernBertConfig, ModernBertModel,
                            dict(common, num_hidden_layers=3, vocab_size=nb,
                                 max_position_embeddings=128, global_attn_every_n_layers=2,
                                 local_attention=16, global_rope_theta=160000.0,
                                 local_rope_theta=10000.0, pad_token_id=0,
                                 bos_token_id=cls, cls_token_id=cls, eos_token_id=sep,
                                 sep_token_id=sep, _limit=128),
                            bert_tokenizer, "mean", [], "float32", False, {}),
        # A decoder: causal, 4 query heads sharing 2 key-value heads, heads
        # 16 wide (not hidden/heads), last-token pooling as Qwen3-Embedding.
        "qwen3-lasttoken": (Qwen3Config, Qwen3Model,
                            dict(common, vocab_size=nb, num_key_value_heads=2, head_dim=16,
                                 max_position_embeddings=128, rms_norm_eps=1e-6,
                                 rope_parameters={"rope_type": "default",
                                                  "rope_theta": 1000000.0},
                                 pad_token_id=0, bos_token_id=cls, eos_token_id=sep,
                                 tie_word_embeddings=False, _limit=128),
                            bert_tokenizer, "lasttoken", ["normalize"], "bfloat16", False,
                            {"query": "Instruct: Given a web search query, retrieve relevant "
                                      "passages that answer the query\nQuery: "}),
        # Rotary (base 1000), SwiGLU without biases, post-norm, token types.
        "nomic-bert-mean": (NomicBertConfig, NomicBertModel,
                            dict(common, vocab_size=nb, max_position_embeddings=128,
                                 type_vocab_size=2, hidden_act="silu", pad_token_id=0,
                                 _limit=128),
                            bert_tokenizer, "mean", ["normalize"], "float32", False,
                            {"search_query": "search_query: ",
                             "search_document": "search_document: "}),
        # Rotary (base 160000), biased attention, gated GELU, post-norm.
        "gte-cls": (GteConfig, GteModel,
                    dict(common, vocab_size=nb, max_position_embeddings=128,
                         type_vocab_size=1, hidden_act="gelu", pad_token_id=0, _limit=128),
                    bert_tokenizer, "cls", ["normalize"], "float16", False, {}),
    }


def max_seq(cfg):
    if "_limit" in cfg:
        return cfg["_limit"]
    n = cfg.get("max_position_embeddings", 72)
    return n - 2 if "pad_token_id" in cfg else n


def write(name, spec, texts):
    from sentence_transformers import SentenceTransformer, models
    cfg_cls, model_cls, kw, tok_fn, pooling, extra, dtype, shard, prompts = spec
    torch.manual_seed(SEED + sum(map(ord, name)))
    cfg = cfg_cls(**{k: v for k, v in kw.items() if not k.startswith("_")})
    model = model_cls(cfg)
    # Non-trivial LayerNorms and biases (zero and one at initialisation).
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.2)
            elif "relative_attention_bias" in n:
                # Initialised at 0.02, it would hardly move the scores.
                p.mul_(50.0)
    dir_ = os.path.join(OUT, name)
    shutil.rmtree(dir_, ignore_errors=True)
    os.makedirs(dir_)
    torch_dtype = {"float32": torch.float32, "float16": torch.float16,
                   "bfloat16": torch.bfloat16}[dtype]
    model = model.to(torch_dtype)
    model.save_pretrained(dir_, safe_serialization=True,
                          max_shard_size="60KB" if shard else "10GB")
    tok = tok_fn()
    limit = max_seq(kw)
    tok.save(os.path.join(dir_, "tokenizer.json"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": limit,
               "cls_token": tok.id_to_token(tok.encode("").ids[0]) if tok.encode("").ids else None,
               "pad_token": "<pad>" if tok.token_to_id("<pad>") is not None else "[PAD]",
               "unk_token": "<unk>" if tok.token_to_id("<unk>") is not None else "[UNK]"},
              open(os.path.join(dir_, "tokenizer_config.json"), "w"), indent=2)

    word = models.Transformer(dir_, max_seq_length=limit)
    mods = [word]
    pool = models.Pooling(H, pooling_mode=pooling)
    mods.append(pool)
    if "dense" in extra:
        torch.manual_seed(SEED + 1)
        mods.append(models.Dense(H, 24, activation_function=torch.nn.Tanh()))
    if "normalize" in extra:
        mods.append(models.Normalize())
    st = SentenceTransformer(modules=mods, prompts=prompts or None)
    st.save(dir_, safe_serialization=True)
    os.remove(os.path.join(dir_, "README.md"))  # a generated model card
    if shard:
        # st.save wrote the weights whole again: shards only.
        for f in os.listdir(dir_):
            if f.startswith("model") and f.endswith((".safetensors", ".json")):
                os.remove(os.path.join(dir_, f))
        model.save_pretrained(dir_, safe_serialization=True, max_shard_size="60KB")
        assert not os.path.exists(os.path.join(dir_, "model.safetensors"))

    # Token ids as coexec's tokenizer gives them: the same library, the
    # model's limit, no padding.
    tok.enable_truncation(limit)
    tok.no_padding()
    prompt = ("query", prompts["query"]) if "query" in prompts else None
    inputs = [(prompt[1] if prompt else "") + t for t in texts]
    ids = [tok.encode(t).ids for t in inputs]

    ref = SentenceTransformer(dir_, device="cpu")
    ref = ref.double()
    ref.eval()
    vectors = []
    with torch.no_grad():
        for seq in ids:
            x = torch.tensor([seq], dtype=torch.long)
            feats = {"input_ids": x, "attention_mask": torch.ones_like(x)}
            if cfg_cls.__name__ == "BertConfig":
                feats["token_type_ids"] = torch.zeros_like(x)
            out = ref.forward(feats)
            vectors.append(out["sentence_embedding"][0].tolist())
    json.dump({"family": cfg.model_type, "pooling": pooling, "dtype": dtype,
               "max_seq_length": limit, "sentences": texts,
               "prompt": {"name": prompt[0], "text": prompt[1]} if prompt else None,
               "ids": ids, "vectors": vectors},
              open(os.path.join(dir_, "reference.json"), "w"))
    print(f"{name}: {cfg.model_type}, {pooling}, {dtype}, {len(ids)} sentences, "
          f"longest {max(map(len, ids))} tokens, dim {len(vectors[0])}")


def write_splade(name, texts):
    """A SPLADE sparse encoder (BERT's masked-language-model head, then
    SpladePooling: max over tokens of log(1 + relu(logit))) as
    sentence-transformers' SparseEncoder saves it, and its vocabulary-wide
    vectors in float64 on the same ids."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling
    from transformers import BertConfig, BertForMaskedLM
    nb = len(json.load(open(BERT_TOKENIZER))["model"]["vocab"])
    torch.manual_seed(SEED + sum(map(ord, name)))
    cfg = BertConfig(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                     intermediate_size=FF, vocab_size=nb, max_position_embeddings=72)
    model = BertForMaskedLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.2)
    dir_ = os.path.join(OUT, name)
    raw = dir_ + "-raw"
    for d in (dir_, raw):
        shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(raw, safe_serialization=True)
    tok = bert_tokenizer()
    limit = max_seq({"max_position_embeddings": 72})
    tok.save(os.path.join(raw, "tokenizer.json"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": limit,
               "pad_token": "[PAD]", "unk_token": "[UNK]"},
              open(os.path.join(raw, "tokenizer_config.json"), "w"), indent=2)
    se = SparseEncoder(modules=[Transformer(raw, transformer_task="fill-mask",
                                            max_seq_length=limit),
                                SpladePooling(pooling_strategy="max", embedding_dimension=nb)])
    se.save(dir_, safe_serialization=True)
    shutil.rmtree(raw)
    os.remove(os.path.join(dir_, "README.md"))
    tok.enable_truncation(limit)
    tok.no_padding()
    ids = [tok.encode(t).ids for t in texts]
    ref = SparseEncoder(dir_, device="cpu").double().eval()
    vectors = []
    with torch.no_grad():
        for seq in ids:
            x = torch.tensor([seq], dtype=torch.long)
            out = ref.forward({"input_ids": x, "attention_mask": torch.ones_like(x),
                               "token_type_ids": torch.zeros_like(x)})
            vectors.append(out["sentence_embedding"][0].to_dense().tolist())
    json.dump({"family": "bert", "pooling": "splade", "dtype": "float32",
               "max_seq_length": limit, "sentences": texts, "prompt": None,
               "ids": ids, "vectors": vectors},
              open(os.path.join(dir_, "reference.json"), "w"))
    nonzero = sum(1 for v in vectors[0] if v > 0)
    print(f"{name}: bert splade, {len(ids)} sentences, dim {len(vectors[0])}, "
          f"{nonzero} words non-zero in the first")


def hub_config(name, hub_name):
    """A copy of tiny folder `name` with config.json as the Hugging Face
    Hub's checkpoints of the family write it (NomicBERT's GPT-2 names,
    GTE's `new` with its rope fields), and the same reference: the same
    model. (Transformers 5 saves both families' tensors in the Hub's names
    already: `emb_ln`, `attn.Wqkv`, `mlp.fc11`; `attention.qkv_proj`,
    `mlp.up_gate_proj`.)"""
    src, dst = os.path.join(OUT, name), os.path.join(OUT, hub_name)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    cfg = json.load(open(os.path.join(src, "config.json")))
    if cfg["model_type"] == "nomic_bert":
        hub = {"model_type": "nomic_bert", "architectures": ["NomicBertModel"],
               "vocab_size": cfg["vocab_size"], "n_embd": cfg["hidden_size"],
               "n_layer": cfg["num_hidden_layers"], "n_head": cfg["num_attention_heads"],
               "n_inner": cfg["intermediate_size"],
               "n_positions": cfg["max_position_embeddings"],
               "type_vocab_size": cfg["type_vocab_size"],
               "layer_norm_epsilon": cfg["layer_norm_eps"], "activation_function": "swiglu",
               "rotary_emb_base": cfg["rope_parameters"]["rope_theta"],
               "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
               "rotary_scaling_factor": None, "prenorm": False, "qkv_proj_bias": False,
               "mlp_fc1_bias": False, "mlp_fc2_bias": False}
    else:
        hub = dict(cfg, model_type="new", architectures=["NewModel"],
                   position_embedding_type="rope", layer_norm_type="layer_norm",
                   logn_attention_scale=False,
                   rope_theta=cfg["rope_parameters"]["rope_theta"])
        del hub["rope_parameters"]
    json.dump(hub, open(os.path.join(dst, "config.json"), "w"), indent=2)
    print(f"{hub_name}: {name} with the Hub's config.json")


def write_classifier(name, cfg_cls, model_cls, kw, tok_fn, labels, texts):
    """A sequence classifier (a cross-encoder where it has one label) as
    transformers saves it, and its logits in float64 for single texts and
    for pairs (a query and a text), tokenised as a pair by tokenizer.json's
    template (token type 1 for the second text where the family has types)."""
    torch.manual_seed(SEED + sum(map(ord, name)))
    cfg = cfg_cls(**kw, num_labels=len(labels),
                  id2label={i: l for i, l in enumerate(labels)},
                  label2id={l: i for i, l in enumerate(labels)})
    model = model_cls(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.2)
            elif "classifier" in n or "pooler" in n:
                # Initialised at 0.02, the head would give logits near 0.
                p.mul_(20.0)
    dir_ = os.path.join(OUT, name)
    shutil.rmtree(dir_, ignore_errors=True)
    os.makedirs(dir_)
    model.save_pretrained(dir_, safe_serialization=True)
    tok = tok_fn()
    limit = max_seq(kw)
    tok.save(os.path.join(dir_, "tokenizer.json"))
    tok.enable_truncation(limit)
    tok.no_padding()
    queries = [t for t in texts if len(t) < 80][:4]
    pairs = [[q, t] for q in queries[:2] for t in texts[::4]] + [[t] for t in texts[::6]]
    ids, types = [], []
    for pr in pairs:
        e = tok.encode(*pr) if len(pr) == 2 else tok.encode(pr[0])
        ids.append(e.ids)
        types.append(e.type_ids)
    ref = model.double().eval()
    logits = []
    with torch.no_grad():
        for seq, ty in zip(ids, types):
            x = torch.tensor([seq], dtype=torch.long)
            kw2 = {"input_ids": x, "attention_mask": torch.ones_like(x)}
            if cfg_cls.__name__ == "BertConfig":
                kw2["token_type_ids"] = torch.tensor([ty], dtype=torch.long)
            logits.append(ref(**kw2).logits[0].tolist())
    json.dump({"family": cfg.model_type, "kind": "classifier", "labels": labels,
               "max_seq_length": limit, "pairs": pairs, "ids": ids, "logits": logits},
              open(os.path.join(dir_, "reference.json"), "w"))
    print(f"{name}: {cfg.model_type} classifier, {len(labels)} labels, {len(pairs)} inputs, "
          f"longest {max(map(len, ids))} tokens")


def classifiers():
    from transformers import (BertConfig, BertForSequenceClassification, DistilBertConfig,
                              DistilBertForSequenceClassification, XLMRobertaConfig,
                              XLMRobertaForSequenceClassification)
    nb = len(json.load(open(BERT_TOKENIZER))["model"]["vocab"])
    common = dict(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  intermediate_size=FF)
    return {
        "bert-reranker": (BertConfig, BertForSequenceClassification,
                          dict(common, vocab_size=nb, max_position_embeddings=72),
                          bert_tokenizer, ["LABEL_0"]),
        "xlm-roberta-classifier": (XLMRobertaConfig, XLMRobertaForSequenceClassification,
                                   dict(common, vocab_size=nb, max_position_embeddings=74,
                                        pad_token_id=1, type_vocab_size=1),
                                   roberta_tokenizer, ["negative", "neutral", "positive"]),
        "distilbert-classifier": (DistilBertConfig, DistilBertForSequenceClassification,
                                  dict(vocab_size=nb, dim=H, n_layers=LAYERS, n_heads=HEADS,
                                       hidden_dim=FF, max_position_embeddings=72),
                                  bert_tokenizer, ["no", "yes"]),
    }


def buckets():
    """MPNet's relative-position buckets for distances -300..300, from
    transformers itself (the Rust test checks its own against them)."""
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder
    rel = torch.arange(-300, 301)
    b = MPNetEncoder.relative_position_bucket(rel, num_buckets=32, max_distance=128)
    json.dump({"from": -300, "buckets": b.tolist()},
              open(os.path.join(OUT, "mpnet-buckets.json"), "w"))


def main():
    os.makedirs(OUT, exist_ok=True)
    texts = sentences()
    for name, spec in families().items():
        write(name, spec, texts)
    hub_config("nomic-bert-mean", "nomic-bert-hub")
    hub_config("gte-cls", "gte-hub")
    write_splade("bert-splade", texts)
    for name, (cfg_cls, model_cls, kw, tok_fn, labels) in classifiers().items():
        write_classifier(name, cfg_cls, model_cls, kw, tok_fn, labels, texts)
    buckets()
    return 0


if __name__ == "__main__":
    sys.exit(main())
