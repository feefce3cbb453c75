#!/usr/bin/env python3
"""Peak RSS of `coexec serve --model DIR` under 16 concurrent /tokenize
requests at the limit: 32 texts of 63 999 characters each, one-letter words
(a token per 2 bytes, 67 MB of JSON an answer). Loopback only, one round of
16 requests, bounded; prints the statuses and the server's idle and peak
(VmHWM) RSS.

usage: python3 scripts/tokenize_rss.py COEXEC_BINARY MODEL_DIR"""
import http.client
import json
import subprocess
import sys
import threading
import time

binary, model = sys.argv[1], sys.argv[2]
srv = subprocess.Popen([binary, "serve", "--model", model, "--addr", "127.0.0.1:0",
                        "--devices", "cpu:1", "--gpu-telemetry-s", "0"],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
try:
    host, port = srv.stdout.readline().strip().rsplit("/", 1)[1].split(":")

    def status(field):
        for line in open(f"/proc/{srv.pid}/status"):
            if line.startswith(field):
                return int(line.split()[1]) // 1024

    text = ("a " * 31999).strip()
    body = json.dumps({"inputs": [text] * 32}).encode()
    assert len(body) <= 2 << 20, len(body)
    idle = status("VmRSS")
    codes, sizes = [], []

    def one():
        c = http.client.HTTPConnection(host, int(port), timeout=300)
        c.request("POST", "/tokenize", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        codes.append(r.status)
        sizes.append(len(data))

    threads = [threading.Thread(target=one) for _ in range(16)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    peak = status("VmHWM")
    print(f"body {len(body)} B; statuses {sorted(codes)}; largest answer "
          f"{max(sizes) / 1e6:.1f} MB; {time.time() - t0:.1f} s")
    print(f"RSS idle {idle} MiB; peak (VmHWM) {peak} MiB; added {peak - idle} MiB")
finally:
    srv.terminate()
    srv.wait(timeout=60)
