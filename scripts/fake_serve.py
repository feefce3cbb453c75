#!/usr/bin/env python3
"""A stand-in for `coexec serve`, to check serve_sweep.py's plumbing (stdlib only).

It takes the same flags, prints `listening on http://127.0.0.1:PORT` once
ready, and serves `POST /v1/infer` with the *reference* labels of the digits
test rows (looked up in the safetensors file, not computed), so accuracy
checks pass. Each device class is one worker thread taking batches of up to
--max-batch requests from a bounded queue, for `--batch-ms + --row-ms x rows`
divided by its speed (`sim:1@0.5` is half as fast); the policy is ignored.
Queue full -> 503 with Retry-After; a request older than --deadline-ms when
its batch starts -> 504; SIGTERM -> stop accepting, answer what is queued,
exit 0. It shows nothing about coexec's scheduling: it only lets the sweep,
overload and SIGTERM modes run end to end before the real service exists.

    python3 scripts/serve_sweep.py --repeats 1 \\
      --server-cmd 'python3 scripts/fake_serve.py --addr {addr} --devices {devices} \\
                    --policy {policy} --max-batch {max_batch} --queue {queue}'
"""

import argparse
import http.server
import json
import os
import queue
import signal
import struct
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def reference_labels(path):
    """{row values rounded: the model's label} from the test file."""
    with open(path, "rb") as f:
        b = f.read()
    (n,) = struct.unpack("<Q", b[:8])
    header = json.loads(b[8 : 8 + n])
    data = b[8 + n :]

    def tensor(name, fmt):
        t = header[name]
        lo, hi = t["data_offsets"]
        return t["shape"], struct.unpack(f"<{(hi - lo) // struct.calcsize(fmt)}{fmt}", data[lo:hi])

    (rows, features), x = tensor("x", "f")
    _, pred = tensor("pred" if "pred" in header else "y", "q")
    return {
        tuple(round(v, 4) for v in x[r * features : (r + 1) * features]): pred[r] for r in range(rows)
    }


class Job:
    def __init__(self, rows):
        self.rows = rows
        self.arrived = time.monotonic()
        self.done = threading.Event()
        self.status = 200
        self.labels = None


def worker(jobs, speed, args, labels, stop):
    while True:
        try:
            first = jobs.get(timeout=0.05)
        except queue.Empty:
            if stop.is_set():
                return
            continue
        batch = [first]
        wait_until = time.monotonic() + args.max_wait_us / 1e6
        while len(batch) < args.max_batch:
            try:
                batch.append(jobs.get(timeout=max(0.0, wait_until - time.monotonic())))
            except queue.Empty:
                break
        now = time.monotonic()
        live = []
        for j in batch:
            if args.deadline_ms and (now - j.arrived) * 1000 > args.deadline_ms:
                j.status = 504
                j.done.set()
            else:
                live.append(j)
        rows = sum(len(j.rows) for j in live)
        if live:
            time.sleep((args.batch_ms + args.row_ms * rows) / 1000 / speed)
        for j in live:
            j.labels = [labels.get(tuple(round(v, 4) for v in r), 0) for r in j.rows]
            j.done.set()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--addr", default="127.0.0.1:8080")
    p.add_argument("--devices", default="cpu:1")
    p.add_argument("--policy", default="hybrid")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--max-wait-us", type=int, default=2000)
    p.add_argument("--queue", type=int, default=256)
    p.add_argument("--profile-dir")
    p.add_argument("--deadline-ms", type=float)
    p.add_argument("--batch-ms", type=float, default=2.0)
    p.add_argument("--row-ms", type=float, default=0.2)
    p.add_argument("--data", default=os.path.join(ROOT, "examples/models/digits_test.safetensors"))
    args = p.parse_args()
    labels = reference_labels(args.data)
    jobs = queue.Queue(maxsize=args.queue)
    stop = threading.Event()
    workers = []
    for spec in args.devices.split(","):
        speed = float(spec.split("@")[1]) if "@" in spec else 1.0
        t = threading.Thread(target=worker, args=(jobs, speed, args, labels, stop), daemon=True)
        t.start()
        workers.append(t)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out as two writes
        timeout = 5  # idle keep-alive connections close, so shutdown can join them

        def log_message(self, *a):
            pass

        def reply(self, status, body, headers=()):
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/metrics":
                self.reply(200, f"coexec_queue_size {jobs.qsize()}\n")
            else:
                self.reply(404, '{"error":"not found"}')

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path != "/v1/infer":
                return self.reply(404, '{"error":"not found"}')
            try:
                rows = json.loads(body)["inputs"]
            except (ValueError, KeyError):
                return self.reply(400, '{"error":"expected {\\"inputs\\": [[64 numbers], ...]}"}')
            job = Job(rows)
            try:
                jobs.put_nowait(job)
            except queue.Full:
                return self.reply(503, '{"error":"overloaded"}', [("Retry-After", "1")])
            job.done.wait()
            if job.status != 200:
                return self.reply(job.status, '{"error":"deadline passed"}')
            outs = []
            for label in job.labels:
                probs = [0.0] * 10
                probs[label] = 1.0
                outs.append({"label": label, "probs": probs})
            rid = self.headers.get("x-request-id")
            self.reply(200, json.dumps({"outputs": outs}), [("x-request-id", rid)] if rid else [])

    host, port = args.addr.rsplit(":", 1)
    server = http.server.ThreadingHTTPServer((host, int(port)), Handler)
    server.daemon_threads = False
    server.block_on_close = True
    server.request_queue_size = 1024

    def on_term(*_):
        # shutdown() waits for serve_forever, so not from the signal handler.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    print(f"listening on http://{host}:{server.server_address[1]}", flush=True)
    server.serve_forever()
    server.socket.close()  # stop accepting at once
    server.server_close()  # joins handler threads: every accepted request answered
    stop.set()
    for t in workers:
        t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
