#!/usr/bin/env python3
"""Train an MLP classifier that coexec serves, and save it as safetensors.

    pip install -r scripts/requirements-train.txt
    python3 scripts/train_digits.py                      # the committed digits model
    python3 scripts/train_digits.py --dataset wine --layers 48,24,12 --max-iter 400
                                                         # the committed wine model
    python3 scripts/train_digits.py --layers 256 --out /tmp/small

Data: scikit-learn's bundled datasets (no download):

- digits: 1797 images, 8x8, 10 classes. Inputs are the 64 pixel intensities
  in 0..16 divided by 16, so every feature lies in [0, 1]; a server must
  scale its inputs the same way (callers send scaled pixels).
- wine: 178 wines, 13 chemical measurements, 3 cultivars. The features are
  standardised for training and the standardisation is folded into fc1, so
  the saved model takes the raw measurements.
- breast_cancer: 569 tumours, 30 measurements, 2 classes; standardised and
  folded as wine's.

The layer count and widths are the caller's (`--layers`): coexec reads them
from the file.

The held-back test split is fixed: 20 % of the rows, stratified by label,
chosen by `--seed` (default 0). Training uses only the other 80 %.

Network (as trained, and as `coexec_kernels::workloads::Mlp` computes it),
for --layers w1,w2 (the digits default is 1024,1024):

    h1 = relu(x  @ fc1.weight.T + fc1.bias)     fc1.weight: [w1, features]
    h2 = relu(h1 @ fc2.weight.T + fc2.bias)     fc2.weight: [w2, w1]
    p  = softmax(h2 @ fc3.weight.T + fc3.bias)  fc3.weight: [classes, w2]

Writes, into --out (default examples/models), for --name N (default: the
dataset's name):

    N_mlp.safetensors       fc{1..}.{weight,bias}, float32, [out, in]
    N_test.safetensors      x: f32 [n, features] (as the model takes them),
                            y: i64 [n] true labels, pred: i64 [n] this model's labels,
                            probs: f32 [k, classes] its probabilities for the first k rows
    N_mlp.json              accuracy, sizes, seed, scaling, library versions
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import safetensors
import sklearn
from safetensors.numpy import save_file
from sklearn.datasets import load_breast_cancer, load_digits, load_wine
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

PIXEL_SCALE = 16.0
PROBS_ROWS = 32
DATASETS = {"digits": load_digits, "wine": load_wine, "breast_cancer": load_breast_cancer}


def widths(text: str) -> list:
    try:
        ws = [int(w) for w in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected widths like 32,16, not {text!r}")
    if not ws or min(ws) < 1:
        raise argparse.ArgumentTypeError("every width must be positive")
    return ws


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", choices=sorted(DATASETS), default="digits")
    ap.add_argument("--layers", type=widths, default=[1024, 1024],
                    help="widths of the hidden layers, comma-separated (default 1024,1024)")
    ap.add_argument("--name", help="file name prefix (default: the dataset's name)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the test split and of training")
    ap.add_argument("--test-size", type=float, default=0.2, help="fraction held back for the test")
    ap.add_argument("--max-iter", type=int, default=60, help="training epochs (adam)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "examples", "models"))
    args = ap.parse_args()
    name = args.name or args.dataset

    data = DATASETS[args.dataset]()
    y = data.target.astype(np.int64)
    if args.dataset == "digits":
        x = (data.data / PIXEL_SCALE).astype(np.float32)
        scale = f"pixels/{PIXEL_SCALE:g}"
    else:
        x = data.data.astype(np.float32)
        scale = "raw (standardisation folded into fc1)"
    classes = len(np.unique(y))
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=args.test_size, random_state=args.seed, stratify=y
    )

    # Standardise by the training split's statistics; the model then learns
    # on x_train_std = (x - mean) / std.
    mean = np.zeros(x.shape[1], dtype=np.float64)
    std = np.ones(x.shape[1], dtype=np.float64)
    if args.dataset != "digits":
        mean = x_train.mean(axis=0, dtype=np.float64)
        std = x_train.std(axis=0, dtype=np.float64)
        std[std == 0] = 1.0

    def standard(v):
        return ((v - mean) / std).astype(np.float32)

    t0 = time.time()
    clf = MLPClassifier(
        hidden_layer_sizes=tuple(args.layers),
        activation="relu",
        solver="adam",
        max_iter=args.max_iter,
        random_state=args.seed,
    )
    clf.fit(standard(x_train) if args.dataset != "digits" else x_train, y_train)
    train_s = time.time() - t0
    if list(clf.classes_) != list(range(classes)):
        print(f"unexpected classes {clf.classes_}", file=sys.stderr)
        return 1

    x_in = standard(x_test) if args.dataset != "digits" else x_test
    pred = clf.predict(x_in).astype(np.int64)
    probs = clf.predict_proba(x_in).astype(np.float32)
    correct = int((pred == y_test).sum())
    accuracy = correct / len(y_test)

    os.makedirs(args.out, exist_ok=True)
    # sklearn keeps coefs_[i] as [in, out]; store [out, in] as PyTorch names do.
    tensors = {}
    for i, (w, b) in enumerate(zip(clf.coefs_, clf.intercepts_), start=1):
        w, b = w.astype(np.float64), b.astype(np.float64)
        if i == 1 and args.dataset != "digits":
            # x_std @ W + b = x @ (W / std) + (b - (mean / std) @ W): the
            # saved first layer takes raw features.
            b = b - (mean / std) @ w
            w = w / std[:, None]
        tensors[f"fc{i}.weight"] = np.ascontiguousarray(w.T.astype(np.float32))
        tensors[f"fc{i}.bias"] = b.astype(np.float32)
    meta = {"format": "coexec-mlp", "dataset": args.dataset, "input_scale": scale}
    save_file(tensors, os.path.join(args.out, f"{name}_mlp.safetensors"), metadata=meta)
    save_file(
        {
            "x": np.ascontiguousarray(x_test),
            "y": y_test,
            "pred": pred,
            "probs": np.ascontiguousarray(probs[:PROBS_ROWS]),
        },
        os.path.join(args.out, f"{name}_test.safetensors"),
    )
    report = {
        "accuracy": accuracy,
        "correct": correct,
        "test_rows": int(len(y_test)),
        "train_rows": int(len(y_train)),
        "dataset": args.dataset,
        "widths": [int(x.shape[1])] + list(args.layers) + [classes],
        "seed": args.seed,
        "test_size": args.test_size,
        "epochs": int(clf.n_iter_),
        "input_scale": scale,
        "train_seconds": round(train_s, 1),
        "versions": {
            "python": sys.version.split()[0],
            "numpy": np.__version__,
            "scikit-learn": sklearn.__version__,
            "safetensors": safetensors.__version__,
        },
    }
    with open(os.path.join(args.out, f"{name}_mlp.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"{name}: test accuracy {accuracy:.4f} ({correct}/{len(y_test)}), layers {args.layers}, "
          f"{clf.n_iter_} epochs, {train_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
