#!/usr/bin/env python3
"""Writes tests/data/tiny-bert/, the embedding tests' own model: a BERT
sentence encoder in all-MiniLM-L6-v2's layout and files (config.json,
tokenizer.json, model.safetensors, 1_Pooling/config.json, modules.json,
sentence_bert_config.json), small enough to commit (about 230 KB), with the
same bytes on every run (seeded weights, the standard library only).

    python3 scripts/make_tiny_bert.py           # write the folder
    python3 scripts/make_tiny_bert.py --check   # exit 1 if it differs from this script's

Its shape: hidden width 32, 2 layers of 2 heads, feed-forward 128, 512
positions, max_seq_length 256 (all-MiniLM-L6-v2's limit), mean pooling, and
a WordPiece vocabulary of a few hundred entries: the special tokens, every
ASCII letter, digit and punctuation mark (alone and as a `##` piece, so
that any ASCII word has tokens), some suffixes, and whole words: those the
tests tokenise (`hello`, `there`, `cafe`, `word`, ...) and the commonest of
tests/data/embed_sentences.jsonl. Its vectors mean nothing: tests that need
the real model's numbers use the real model.

The weights are uniform in (-s, s), s per tensor, from splitmix64. The
query and key weights are larger than the rest (s = 1.0) so that a query
and key scaled by 1e19 (tests/cli/common.rs's `Hostile::overflowing`)
overflow f32 in attention's scores, as the real model's do.

safetensors: an 8-byte little-endian header length, a JSON header
(name -> dtype, shape, data_offsets), padded with spaces to 8 bytes, then
the tensors' raw little-endian f32 data back to back.
"""

import argparse
import json
import os
import struct
import sys

OUT = "tests/data/tiny-bert"
SEED = 20261203

HIDDEN = 32
LAYERS = 2
HEADS = 2
INTERMEDIATE = 128
POSITIONS = 512
MAX_SEQ_LENGTH = 256

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
SUFFIXES = ["s", "es", "ed", "ing", "er", "ly", "est", "ion", "al", "ment", "ness",
            "able", "ful", "less", "ous", "ive", "y", "en", "ers"]
# The words the tests tokenise, and the probe sentence the loader runs.
TEST_WORDS = """
hello there cafe word a an the man is eating food piece of bread girl carrying baby
riding horse hi alias still serving good text another one fine cat dog sat on mat
sentence slept river stone weather lovely today it so sunny outside he drove to
stadium coexec checks that model answers are finite this embeddings short line
""".split()
# The commonest words of tests/data/embed_sentences.jsonl (lowercased).
CORPUS_WORDS = """
the a was in of old an gpu our cluster with on hurry museum guide floor lab third
ancient pouring rain my neighbour under oak tree great care over weekend two hikers
after lunch at engineer young pianist without near harbour mountain trail station
and sailor compiler rewrote startup stray before sunrise curious child translated
long letter behind library tired student violin database wooden bridge strange noise
garden fence followed storm measured small borrowed explained morning new scheduler
every failing test tuesday orchestra carried discovered last photographed lecture
notes her grandmother train committee cooked abandoned network cable benchmark
results kitchen table because inspected stack invoices cup coffee while research
team even though baker then until during meeting painted bowl soup tested quarterly
report celebrated repaired red umbrella mayor although sold but loaf described pile
leaves scheduled ignored broken bicycle map slow fragile repeated careful rusty
stubborn bright enormous expensive cheerful efficient gentle unexpected noisy quiet
by example version replaced tokenizer main data select name from users where created
order limit docker run work commit fix off push origin
""".split()


def vocabulary():
    """Token -> id: special tokens first, then characters, pieces, words."""
    tokens = list(SPECIAL)
    tokens += list(PUNCTUATION)
    tokens += [str(d) for d in range(10)]
    tokens += [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens += ["##" + str(d) for d in range(10)]
    tokens += ["##" + chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens += ["##" + s for s in SUFFIXES]
    tokens += TEST_WORDS + CORPUS_WORDS
    vocab = {}
    for t in tokens:
        vocab.setdefault(t, len(vocab))
    return vocab


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & 0xFFFFFFFFFFFFFFFF

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return z ^ (z >> 31)

    def uniform(self):
        """In [-1, 1)."""
        return (self.next() >> 11) / float(1 << 52) - 1.0


def tensors(vocab_size):
    """(name, shape, values) of every tensor, in Hugging Face BertModel's names."""
    rng = SplitMix64(SEED)
    out = []

    def add(name, shape, scale, base=0.0):
        n = 1
        for d in shape:
            n *= d
        out.append((name, shape, [base + scale * rng.uniform() for _ in range(n)]))

    def norm(name):
        add(name + ".weight", [HIDDEN], 0.1, 1.0)
        add(name + ".bias", [HIDDEN], 0.1)

    def dense(name, outs, ins, scale):
        add(name + ".weight", [outs, ins], scale)
        add(name + ".bias", [outs], 0.1)

    add("embeddings.word_embeddings.weight", [vocab_size, HIDDEN], 1.0)
    add("embeddings.position_embeddings.weight", [POSITIONS, HIDDEN], 0.5)
    add("embeddings.token_type_embeddings.weight", [2, HIDDEN], 0.5)
    norm("embeddings.LayerNorm")
    for l in range(LAYERS):
        p = "encoder.layer.%d." % l
        dense(p + "attention.self.query", HIDDEN, HIDDEN, 1.0)
        dense(p + "attention.self.key", HIDDEN, HIDDEN, 1.0)
        dense(p + "attention.self.value", HIDDEN, HIDDEN, 0.3)
        dense(p + "attention.output.dense", HIDDEN, HIDDEN, 0.3)
        norm(p + "attention.output.LayerNorm")
        dense(p + "intermediate.dense", INTERMEDIATE, HIDDEN, 0.3)
        dense(p + "output.dense", HIDDEN, INTERMEDIATE, 0.15)
        norm(p + "output.LayerNorm")
    return out


def safetensors(ts):
    header = {"__metadata__": {"format": "pt"}}
    blobs = []
    at = 0
    for name, shape, values in sorted(ts):
        blob = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    h = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def tokenizer(vocab):
    added = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for t in SPECIAL]

    def special(t, type_id=0):
        return {"SpecialToken": {"id": t, "type_id": type_id}}

    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "clean_text": True,
                       "handle_chinese_chars": True, "strip_accents": None,
                       "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [special("[CLS]"), {"Sequence": {"id": "A", "type_id": 0}},
                       special("[SEP]")],
            "pair": [special("[CLS]"), {"Sequence": {"id": "A", "type_id": 0}},
                     special("[SEP]"), {"Sequence": {"id": "B", "type_id": 1}},
                     special("[SEP]", 1)],
            "special_tokens": {
                t: {"id": t, "ids": [vocab[t]], "tokens": [t]} for t in ("[CLS]", "[SEP]")
            },
        },
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": "[UNK]",
                  "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
                  "vocab": vocab},
    }


def files():
    """Relative path -> bytes of every file of the folder."""
    vocab = vocabulary()
    config = {
        "_name_or_path": "coexec tiny-bert (scripts/make_tiny_bert.py): a test model, random weights",
        "architectures": ["BertModel"],
        "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": POSITIONS,
        "model_type": "bert",
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "type_vocab_size": 2,
        "vocab_size": len(vocab),
    }
    pooling = {
        "word_embedding_dimension": HIDDEN,
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    st = {"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False}

    def js(v, indent=2):
        return (json.dumps(v, indent=indent, ensure_ascii=False) + "\n").encode()

    return {
        "config.json": js(config),
        "tokenizer.json": js(tokenizer(vocab), None),
        "model.safetensors": safetensors(tensors(len(vocab))),
        "1_Pooling/config.json": js(pooling),
        "modules.json": js(modules),
        "sentence_bert_config.json": js(st),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--check", action="store_true",
                    help="compare the folder with this script's output; write nothing")
    a = ap.parse_args()
    want = files()
    if a.check:
        bad = []
        for rel, data in sorted(want.items()):
            path = os.path.join(a.out, rel)
            try:
                with open(path, "rb") as f:
                    same = f.read() == data
            except OSError:
                same = False
            if not same:
                bad.append(path)
        if bad:
            print("differs from scripts/make_tiny_bert.py's output: " + ", ".join(bad))
            sys.exit(1)
        print("%s: %d files, as scripts/make_tiny_bert.py writes them" % (a.out, len(want)))
        return
    for rel, data in sorted(want.items()):
        path = os.path.join(a.out, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
    total = sum(len(d) for d in want.values())
    print("%s: %d files, %d bytes, vocabulary %d" % (a.out, len(want), total, len(vocabulary())))


if __name__ == "__main__":
    main()
