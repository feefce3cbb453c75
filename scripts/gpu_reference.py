#!/usr/bin/env python3
"""Independent ceilings and reference timings on the GPU machine (PyTorch).

Measures, with CUDA events (median of repeats after warm-up):
  * host->device and device->host bandwidth, pinned and pageable;
  * device-to-device copy bandwidth (bytes read + written);
  * fp32 matrix-product rate on a large square product (TF32 off);
  * the four workloads at the sizes scripts/gpu_check.sh benchmarks, on the
    device alone (inputs already there) and with the host transfers a
    co-executing runtime must pay (pageable host memory in and out);
  * the committed digits MLP (examples/models): its test accuracy and
    probabilities against the training script's, and its forward time per
    batch of 1 to 8192 rows, with and without the transfers.

Prints one JSON object (and a short table on stderr). No argument needed;
`--bus-only` stops after the bandwidths (a few seconds).
"""
import json
import statistics
import sys

import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda")


def timed(fn, reps=10, warm=2):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return statistics.median(ts)


out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
g = torch.Generator().manual_seed(1)

# --- bandwidths ---------------------------------------------------------------
nbytes = 1 << 30
hp = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
hq = torch.empty(nbytes, dtype=torch.uint8)
hq.random_(generator=g)
hp.copy_(hq)
d = torch.empty(nbytes, dtype=torch.uint8, device=dev)
d2 = torch.empty_like(d)
out["h2d_pinned_GBps"] = nbytes / timed(lambda: d.copy_(hp, non_blocking=True)) / 1e9
out["d2h_pinned_GBps"] = nbytes / timed(lambda: hp.copy_(d, non_blocking=True)) / 1e9
out["h2d_pageable_GBps"] = nbytes / timed(lambda: d.copy_(hq), reps=5) / 1e9
out["d2h_pageable_GBps"] = nbytes / timed(lambda: hq.copy_(d), reps=5) / 1e9
out["d2d_GBps_read_plus_write"] = 2 * nbytes / timed(lambda: d2.copy_(d)) / 1e9
del hp, hq, d, d2
if "--bus-only" in sys.argv[1:]:
    print(json.dumps(out))
    for k, v in out.items():
        print(f"{k:<32} {v}", file=sys.stderr)
    sys.exit(0)

n = 8192
A = torch.randn(n, n, device=dev)
B = torch.randn(n, n, device=dev)
out["fp32_matmul_TFLOPs"] = 2 * n**3 / timed(lambda: A @ B) / 1e12
del A, B

# --- matmul: 60000 products of 100x100 f32 --------------------------------------
count, dim = 60000, 100
ha = torch.rand(count, dim, dim, generator=g)
hb = torch.rand(count, dim, dim, generator=g)
da, db = ha.to(dev), hb.to(dev)
out["matmul_device_s"] = timed(lambda: torch.bmm(da, db))
out["matmul_with_transfers_s"] = timed(lambda: torch.bmm(ha.to(dev), hb.to(dev)).cpu(), reps=5)
out["matmul_bytes"] = 3 * count * dim * dim * 4
out["matmul_flops"] = 2 * count * dim**3
del ha, hb, da, db

# --- nbody: one all-pairs step, 65536 bodies, softened ---------------------------
nb = 65536
pos = torch.rand(nb, 3, generator=g).to(dev)
mass = torch.rand(nb, generator=g).to(dev)


def nbody_step():
    acc = torch.empty_like(pos)
    for lo in range(0, nb, 4096):
        dx = pos[None, :, :] - pos[lo:lo + 4096, None, :]  # (4096, nb, 3)
        r2 = (dx * dx).sum(-1) + 0.01
        inv = mass[None, :] * torch.rsqrt(r2) ** 3
        acc[lo:lo + 4096] = (dx * inv[..., None]).sum(1)
    return acc


out["nbody_step_device_s"] = timed(nbody_step, reps=5)
out["nbody_interactions_per_step"] = nb * nb
del pos, mass

# --- kmeans: one assignment + centre sums on kdd_cup's shape ---------------------
pts_h = torch.rand(494020, 34, generator=g)
pts = pts_h.to(dev)
cent = pts[:5].clone()


def kmeans_step():
    dist = torch.cdist(pts, cent)
    m = dist.argmin(1)
    sums = torch.zeros(5, 34, device=dev).index_add_(0, m, pts)
    return m, sums


out["kmeans_step_device_s"] = timed(kmeans_step)
out["kmeans_points_upload_s"] = timed(lambda: pts_h.to(dev), reps=5)
del pts, pts_h

# --- pathfinder: 1000 rows of 1e6 columns, min of three neighbours ----------------
cols, rows = 1_000_000, 1000
wall_h = torch.randint(0, 10, (rows, cols), dtype=torch.uint8, generator=g)
wall = wall_h.to(dev)


def pathfinder():
    cur = wall[0].to(torch.int32)
    big = torch.iinfo(torch.int32).max
    for r in range(1, rows):
        left = torch.cat([cur.new_full((1,), big), cur[:-1]])
        right = torch.cat([cur[1:], cur.new_full((1,), big)])
        cur = torch.minimum(torch.minimum(left, right), cur) + wall[r]
    return cur


out["pathfinder_device_s"] = timed(pathfinder, reps=3, warm=1)
out["pathfinder_wall_upload_s"] = timed(lambda: wall_h.to(dev), reps=3)

# --- the digits MLP served by `coexec serve`: forward per batch ------------------
# The committed weights, read without the safetensors package (8-byte header
# length, JSON header, raw little-endian tensors).
def load_safetensors(path):
    import struct
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    dtypes = {"F32": torch.float32, "I64": torch.int64}
    t = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        lo, hi = meta["data_offsets"]
        buf = bytearray(raw[8 + n + lo : 8 + n + hi])
        t[name] = torch.frombuffer(buf, dtype=dtypes[meta["dtype"]]).reshape(meta["shape"])
    return t


try:
    mw = {k: v.to(dev) for k, v in load_safetensors("examples/models/digits_mlp.safetensors").items()}
    split = load_safetensors("examples/models/digits_test.safetensors")

    def mlp(x):
        h = torch.relu(x @ mw["fc1.weight"].T + mw["fc1.bias"])
        h = torch.relu(h @ mw["fc2.weight"].T + mw["fc2.bias"])
        return torch.softmax(h @ mw["fc3.weight"].T + mw["fc3.bias"], dim=1)

    p = mlp(split["x"].to(dev)).cpu()
    out["mlp_test_accuracy"] = (p.argmax(1) == split["y"]).double().mean().item()
    k = split["probs"].shape[0]
    out["mlp_max_abs_diff_vs_script_probs"] = (p[:k] - split["probs"]).abs().max().item()
    hx = split["x"]
    for rows in (1, 16, 128, 1024, 8192):
        xb = hx.repeat((rows + hx.shape[0] - 1) // hx.shape[0], 1)[:rows].contiguous().pin_memory()
        dx = xb.to(dev)
        out[f"mlp_{rows}rows_device_s"] = timed(lambda: mlp(dx), reps=20, warm=3)
        out[f"mlp_{rows}rows_with_transfers_s"] = timed(lambda: mlp(xb.to(dev, non_blocking=True)).cpu(), reps=20, warm=3)
except FileNotFoundError as e:
    out["mlp_skipped"] = str(e)

print(json.dumps(out, indent=1))
for k, v in out.items():
    print(f"{k:32s} {v}", file=sys.stderr)
