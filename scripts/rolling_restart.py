#!/usr/bin/env python3
"""Three `coexec serve` replicas behind HAProxy, restarted one by one under
load: nothing may be lost, and every answer at the client must be a 200.

HAProxy health-checks each replica's /readyz every 200 ms and takes it out
on the first 503; a replica gets SIGTERM, drains (after `--drain-delay-s`,
during which it is not ready but still serves), exits 0 and is started
again on the same port, and the next one goes only once HAProxy routes to it
again. `coexec-load` sends at a fixed rate to HAProxy throughout (loopback
only, bounded in requests and time).

HAProxy is configured as a deployment would be: a failed connection, an
empty response or a replica's 503 is retried on another replica (a draining
replica answers 503 only to requests it did not run, so the retry is safe).
The summary's `haproxy` part says, per replica, how many requests were
retried or sent elsewhere, and how many 5xx the clients got through
HAProxy: with the drain delay at 0 the redispatches show what the delay
prevents.

    python3 scripts/rolling_restart.py --drain-delay 1 --rate 200 --out /tmp/rr

Exits 1 when the check fails (a request lost or answered other than 200, or
a replica that did not exit 0), 2 on a usage or setup error. Stdlib only;
needs haproxy (Debian: apt-get install haproxy).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def die(msg, code=2):
    print(f"rolling_restart: {msg}", file=sys.stderr)
    sys.exit(code)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status(url):
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def wait_for(pred, limit, what):
    t = time.monotonic()
    while time.monotonic() - t < limit:
        if pred():
            return time.monotonic() - t
        time.sleep(0.05)
    die(f"{what} not within {limit} s", 1)


class Replica:
    def __init__(self, args, port, profiles):
        self.args, self.port, self.profiles = args, port, profiles
        self.proc = None

    def start(self):
        argv = [self.args.coexec, "serve", "--addr", f"127.0.0.1:{self.port}",
                "--devices", self.args.devices, "--profile-dir", self.profiles,
                "--drain-delay-s", str(self.args.drain_delay)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("listening on"):
            die(f"replica on {self.port} did not start: {line!r}")
        wait_for(lambda: status(f"http://127.0.0.1:{self.port}/readyz") == 200, 30,
                 f"replica {self.port} ready")

    def stop(self):
        """SIGTERM; (exit code, seconds to exit)."""
        t = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = "killed"
        return code, time.monotonic() - t


def haproxy_config(front, ports, stats):
    servers = "\n".join(f"    server r{i} 127.0.0.1:{p} check" for i, p in enumerate(ports))
    return f"""global
    maxconn 4096
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout check 1s
    retries 2
    option redispatch
    retry-on conn-failure empty-response 503
frontend fe
    bind 127.0.0.1:{front}
    default_backend be
backend be
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    default-server inter 200ms fall 1 rise 2
{servers}
listen stats
    bind 127.0.0.1:{stats}
    stats enable
    stats uri /stats
"""


def haproxy_rows(stats):
    """HAProxy's stats CSV as {(proxy, server): {column: value}}; {} if unreachable."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{stats}/stats;csv", timeout=1) as r:
            lines = r.read().decode().splitlines()
    except OSError:
        return {}
    if not lines:
        return {}
    head = lines[0].lstrip("# ").split(",")
    return {(f[0], f[1]): dict(zip(head, f)) for f in (line.split(",") for line in lines[1:] if line)}


def where_from(stats):
    """Per replica: failed checks, times DOWN, 5xx answered, requests
    retried on it and redispatched off it; and the 5xx the clients got
    through HAProxy (its own, and the replicas' it did not retry). Tells a
    healthy replica a slow check took out from one that was restarting."""
    rows = haproxy_rows(stats)
    n = lambda row, col: int(row.get(col) or 0)
    servers = {k[1]: dict(check_fails=n(v, "chkfail"), downs=n(v, "chkdown"), http_5xx=n(v, "hrsp_5xx"),
                          retried=n(v, "wretr"), redispatched=n(v, "wredis"))
               for k, v in rows.items() if k[0] == "be" and k[1] not in ("FRONTEND", "BACKEND")}
    return dict(servers=servers, clients_5xx=n(rows.get(("fe", "FRONTEND"), {}), "hrsp_5xx"))


def up_in_haproxy(stats, name):
    return haproxy_rows(stats).get(("be", name), {}).get("status", "").startswith("UP")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--coexec", default=os.path.join(ROOT, "target/release/coexec"))
    ap.add_argument("--load", default=os.path.join(ROOT, "target/release/coexec-load"))
    ap.add_argument("--haproxy", default=shutil.which("haproxy") or "/usr/sbin/haproxy")
    ap.add_argument("--devices", default="cpu:1")
    ap.add_argument("--drain-delay", type=int, default=1, help="each replica's --drain-delay-s")
    ap.add_argument("--rate", type=float, default=200, help="requests per second through HAProxy")
    ap.add_argument("--seconds", type=float, default=0,
                    help="load duration (default: long enough for the three restarts)")
    ap.add_argument("--out", help="writes OUT.json")
    args = ap.parse_args()
    for exe in (args.coexec, args.load, args.haproxy):
        if not os.access(exe, os.X_OK):
            die(f"{exe}: not found (build with cargo build --release -p coexec-cli; apt-get install haproxy)")
    tmp = tempfile.mkdtemp(prefix="coexec-rr-")
    ports = [free_port() for _ in range(3)]
    front, stats = free_port(), free_port()
    replicas = [Replica(args, p, os.path.join(tmp, f"profiles{i}")) for i, p in enumerate(ports)]
    cfg = os.path.join(tmp, "haproxy.cfg")
    with open(cfg, "w") as f:
        f.write(haproxy_config(front, ports, stats))
    hap = load = None
    try:
        for r in replicas:
            r.start()
        hap = subprocess.Popen([args.haproxy, "-db", "-f", cfg], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        wait_for(lambda: all(up_in_haproxy(stats, f"r{i}") for i in range(3)), 30, "all replicas up")
        per_replica = args.drain_delay + 6
        seconds = args.seconds or 3 * per_replica + 4
        n = int(args.rate * seconds)
        load = subprocess.Popen([args.load, "--target", f"http://127.0.0.1:{front}", "--rate", f"{args.rate:g}",
                                 "--requests", str(n), "--duration-limit", f"{seconds + 20:g}",
                                 "--timeout", "10", "--json"], stdout=subprocess.PIPE, text=True)
        time.sleep(2)
        restarts = []
        for i, r in enumerate(replicas):
            code, took = r.stop()
            # Out of HAProxy's rotation (with a drain delay, since its first
            # 503 from /readyz; without, once its checks fail), then back.
            wait_for(lambda: not up_in_haproxy(stats, f"r{i}"), 30, f"r{i} down")
            r.start()
            back = wait_for(lambda: up_in_haproxy(stats, f"r{i}"), 30, f"r{i} up again")
            restarts.append(dict(replica=i, exit=code, exit_s=round(took, 3), up_again_s=round(back, 3)))
            print(f"r{i}: exit {code} {took:.2f} s after SIGTERM, routed again {back:.2f} s after its start",
                  file=sys.stderr)
        out, _ = load.communicate(timeout=seconds + 60)
        report = json.loads(out)["rates"][0]
        balancer = where_from(stats)
    finally:
        if load and load.poll() is None:
            load.kill()
        if hap:
            hap.terminate()
        for r in replicas:
            if r.proc and r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
                try:
                    r.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    r.proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    not_200 = report["sent"] - report["ok"]
    summary = dict(drain_delay_s=args.drain_delay, rate=args.rate, sent=report["sent"], ok=report["ok"],
                   status_429=report.get("status_429", 0), status_503=report["status_503"],
                   status_504=report["status_504"], other=report["other"], lost=report["lost"],
                   refused=report["refused"], unsent=report["unsent"],
                   p99_ms=report["latency_ok"]["p99_ms"], restarts=restarts, haproxy=balancer)
    print(json.dumps(summary))
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump(dict(summary=summary, report=report), f, indent=1)
    bad = not_200 or report["unsent"] or any(x["exit"] != 0 for x in restarts)
    if bad:
        print(f"rolling_restart: FAILED: {not_200} of {report['sent']} not 200 "
              f"(503 {report['status_503']}, lost {report['lost']}, refused {report['refused']}, "
              f"other {report['other']}), exits {[x['exit'] for x in restarts]}", file=sys.stderr)
        sys.exit(1)
    print(f"rolling_restart: ok: {report['ok']} of {report['sent']} answered 200 through three restarts",
          file=sys.stderr)


if __name__ == "__main__":
    main()
