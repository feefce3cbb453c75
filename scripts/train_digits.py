#!/usr/bin/env python3
"""Train the digits MLP that coexec serves, and save it as safetensors.

    pip install -r scripts/requirements-train.txt
    python3 scripts/train_digits.py                      # the committed model
    python3 scripts/train_digits.py --hidden 256 --out /tmp/small

Data: scikit-learn's bundled handwritten digits (1797 images, 8x8, 10 classes;
no download). Inputs are the 64 pixel intensities in 0..16 divided by 16, so
every feature lies in [0, 1]; a server must scale its inputs the same way
(the Rust loader does nothing to them: callers send scaled pixels).

The held-back test split is fixed: 20 % of the rows, stratified by label,
chosen by `--seed` (default 0). Training uses only the other 80 %.

Network (as trained, and as `coexec_kernels::workloads::Mlp` computes it):

    h1 = relu(x  @ fc1.weight.T + fc1.bias)     fc1.weight: [hidden, 64]
    h2 = relu(h1 @ fc2.weight.T + fc2.bias)     fc2.weight: [hidden, hidden]
    p  = softmax(h2 @ fc3.weight.T + fc3.bias)  fc3.weight: [10, hidden]

Writes, into --out (default examples/models):

    digits_mlp.safetensors       fc{1,2,3}.{weight,bias}, float32, [out, in]
    digits_test.safetensors      x: f32 [n, 64] (scaled), y: i64 [n] true labels,
                                 pred: i64 [n] this model's labels,
                                 probs: f32 [k, 10] its probabilities for the first k rows
    digits_mlp.json              accuracy, sizes, seed, scaling, library versions
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
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

PIXEL_SCALE = 16.0
PROBS_ROWS = 32


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024, help="units in each of the two hidden layers")
    ap.add_argument("--seed", type=int, default=0, help="seed of the test split and of training")
    ap.add_argument("--test-size", type=float, default=0.2, help="fraction held back for the test")
    ap.add_argument("--max-iter", type=int, default=60, help="training epochs (adam)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "examples", "models"))
    args = ap.parse_args()
    if args.hidden < 1:
        ap.error("--hidden must be positive")

    digits = load_digits()
    x = (digits.data / PIXEL_SCALE).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=args.test_size, random_state=args.seed, stratify=y
    )

    t0 = time.time()
    clf = MLPClassifier(
        hidden_layer_sizes=(args.hidden, args.hidden),
        activation="relu",
        solver="adam",
        max_iter=args.max_iter,
        random_state=args.seed,
    )
    clf.fit(x_train, y_train)
    train_s = time.time() - t0
    if list(clf.classes_) != list(range(10)):
        print(f"unexpected classes {clf.classes_}", file=sys.stderr)
        return 1

    pred = clf.predict(x_test).astype(np.int64)
    probs = clf.predict_proba(x_test).astype(np.float32)
    correct = int((pred == y_test).sum())
    accuracy = correct / len(y_test)

    os.makedirs(args.out, exist_ok=True)
    # sklearn keeps coefs_[i] as [in, out]; store [out, in] as PyTorch names do.
    tensors = {}
    for i, (w, b) in enumerate(zip(clf.coefs_, clf.intercepts_), start=1):
        tensors[f"fc{i}.weight"] = np.ascontiguousarray(w.T.astype(np.float32))
        tensors[f"fc{i}.bias"] = b.astype(np.float32)
    meta = {"format": "coexec-digits-mlp", "input_scale": f"pixels/{PIXEL_SCALE:g}"}
    save_file(tensors, os.path.join(args.out, "digits_mlp.safetensors"), metadata=meta)
    save_file(
        {
            "x": np.ascontiguousarray(x_test),
            "y": y_test,
            "pred": pred,
            "probs": np.ascontiguousarray(probs[:PROBS_ROWS]),
        },
        os.path.join(args.out, "digits_test.safetensors"),
    )
    report = {
        "accuracy": accuracy,
        "correct": correct,
        "test_rows": int(len(y_test)),
        "train_rows": int(len(y_train)),
        "hidden": args.hidden,
        "seed": args.seed,
        "test_size": args.test_size,
        "epochs": int(clf.n_iter_),
        "input_scale": f"pixels/{PIXEL_SCALE:g}",
        "train_seconds": round(train_s, 1),
        "versions": {
            "python": sys.version.split()[0],
            "numpy": np.__version__,
            "scikit-learn": sklearn.__version__,
            "safetensors": safetensors.__version__,
        },
    }
    with open(os.path.join(args.out, "digits_mlp.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"test accuracy {accuracy:.4f} ({correct}/{len(y_test)}), hidden {args.hidden}, "
          f"{clf.n_iter_} epochs, {train_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
