#!/usr/bin/env python3
"""Soak driver for benches/soak.sh: steady open-loop load on a running tiergate (half a
classify, half screened chat requests through a proxy route to two stub apps) while faults
are injected on a fixed 60 s schedule, repeated for the whole run:

  t= 5-15 s  app A answers 500 to every request (the app's own error, relayed to the client)
  t=15-25 s  app A is down (connection refused): P2C and ejection must route around it
  t=25 s     a valid policy edit (reload), t=30 s an invalid one (refused, the last good
             policy keeps serving), t=35 s the file restored
  t=40-42 s  a client flood: 400 concurrent slow requests, past [server] max_concurrent_requests
             (the excess must be shed at once: 503 with Retry-After)
  t=45-55 s  slow clients: 20 connections that send their body a byte per second

Every steady request is recorded by outcome. A *failure* is anything but a 2xx, an intended
shed (429/503 with Retry-After), or the app's own 500 relayed during its 500 phase. The flood
and the slow clients are counted apart (they are the faults, not the load). RSS of the server
is sampled every 5 s; growth is measured from the end of the warm-up to the end. The warm-up
(`--warmup`, 300 s) is five fault cycles: connection buffers and allocator arenas grow to the
peaks of the floods and slow clients in steps, and those peaks differ a little from cycle to
cycle, so a one-minute warm-up counts a high-water mark as growth; a leak grows with requests and
keeps growing after it. Growth from the first minute is printed as well.

Usage: soak.py --port P --admin-port A --apps PORT_A,PORT_B --pid PID --policy-file F
               [--rate 100] [--duration 600] [--json out.json]
Standard library only.
"""
import argparse
import http.client
import json
import os
import queue
import socket
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TEXTS = [
    "see you at the station at noon",
    "Your account is locked. Confirm your password at http://secure-login.example.top/verify",
    "can you send me the slides from yesterday?",
    "Congratulations, you have won! Claim your prize at bit.ly/abc123",
    "rent for march, thanks!",
]


class App:
    """A stub app on `port`: 200 JSON, or 500 while `failing`; `down` closes its listener."""

    def __init__(self, port):
        self.port, self.failing, self.server, self.thread = port, False, None, None
        self.up()

    def up(self):
        app = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                status, body = (500, b'{"app":"error"}') if app.failing else (200, b'{"app":true}')
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST

            def log_message(self, *args):
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def down(self):
        self.server.shutdown()
        self.server.server_close()


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Load:
    """Open-loop steady load: one request every 1/rate s, sent by a pool of keep-alive workers."""

    def __init__(self, port, rate, workers=48):
        self.port, self.rate = port, rate
        self.jobs = queue.Queue()
        self.outcomes = Counter()
        self.lock = threading.Lock()
        self.latencies = []
        for _ in range(workers):
            threading.Thread(target=self.worker, daemon=True).start()

    def record(self, kind, latency=None):
        with self.lock:
            self.outcomes[kind] += 1
            if latency is not None:
                self.latencies.append(latency)

    def worker(self):
        conn = None
        while True:
            i, intended = self.jobs.get()
            text = TEXTS[i % len(TEXTS)]
            if i % 2:
                path, body = "/v1/classify", {"text": text}
            else:
                path, body = "/chat", {"messages": [{"role": "user", "content": text}]}
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
                resp = conn.getresponse()
                answer = resp.read()
                status, retry_after = resp.status, resp.getheader("retry-after")
                if resp.getheader("connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except Exception as e:  # a broken connection, a timeout
                if conn is not None:
                    conn.close()
                conn = None
                self.record(f"error:{type(e).__name__}")
                continue
            latency = time.monotonic() - intended
            if 200 <= status < 300:
                self.record("ok", latency)
            elif status in (429, 503) and retry_after:
                self.record(f"shed:{status}", latency)
            elif status == 403 and path == "/chat":
                self.record("blocked", latency)  # a decision, answered
            elif status == 500 and path == "/chat" and b'"app":"error"' in answer:
                self.record("app_500_relayed", latency)  # the stub app's own error, by its body
            else:
                self.record(f"failed:{status}:{path}", latency)

    def run(self, seconds, start):
        n = int(seconds * self.rate)
        for i in range(n):
            intended = start + i / self.rate
            delay = intended - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self.jobs.put((i, intended))


def flood(port, n, counts):
    """`n` clients at once, each sending its head and half its body, then the rest a second
    later: while they upload, each holds one of the server's request slots, so past
    `max_concurrent_requests` the rest must be shed at once."""
    body = json.dumps({"text": TEXTS[0]}).encode()
    head = f"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    socks = []
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(head.encode() + body[: len(body) // 2])
            socks.append(s)
        except OSError as e:
            counts[f"flood:error:{type(e).__name__}"] += 1
    time.sleep(1)
    for s in socks:
        try:
            s.sendall(body[len(body) // 2:])
            reply = s.recv(4096).decode(errors="replace")
            status = reply.split(" ")[1] if " " in reply else "closed"
            retry = ":retry-after" if "retry-after:" in reply.lower() else ""
            counts[f"flood:{status}{retry}"] += 1
        except OSError as e:
            counts[f"flood:error:{type(e).__name__}"] += 1
        finally:
            s.close()


def slow_client(port, seconds, counts):
    """Declares a 64-byte body and sends it a byte per second."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=seconds + 30)
        s.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 64\r\n\r\n")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            s.sendall(b" ")
            time.sleep(1)
        reply = s.recv(200).split(b" ")
        counts[f"slow:{reply[1].decode() if len(reply) > 1 else 'closed'}"] += 1
    except Exception as e:
        counts[f"slow:{type(e).__name__}"] += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--apps", required=True, help="two ports for the stub apps, A,B")
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--policy-file", required=True, help="the policy file the run edits (restored after)")
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--warmup", type=float, default=300.0, help="seconds before RSS growth is measured")
    ap.add_argument("--json")
    args = ap.parse_args()

    a_port, b_port = (int(p) for p in args.apps.split(","))
    app_a, _app_b = App(a_port), App(b_port)
    load = Load(args.port, args.rate)
    original_policy = open(args.policy_file).read()
    faults = Counter()
    rss = []
    start = time.monotonic()
    sender = threading.Thread(target=load.run, args=(args.duration, start), daemon=True)
    sender.start()

    def at(offset):
        delay = start + offset - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def schedule():
        cycle = 0
        while cycle * 60 < args.duration:
            base = cycle * 60
            at(base + 5)
            app_a.failing = True
            at(base + 15)
            app_a.failing = False
            app_a.down()
            at(base + 25)
            app_a.up()
            with open(args.policy_file, "a") as f:
                f.write(f"\n# soak edit {cycle}\n")
            at(base + 30)
            with open(args.policy_file, "a") as f:
                f.write("\n[[rules]]\nname = \"broken\"\nwhen = \"signals.nope >\"\n")
            at(base + 35)
            with open(args.policy_file, "w") as f:
                f.write(original_policy)
            at(base + 40)
            flood(args.port, 400, faults)
            at(base + 45)
            slow = [threading.Thread(target=slow_client, args=(args.port, 10, faults)) for _ in range(20)]
            for t in slow:
                t.start()
            for t in slow:
                t.join()
            cycle += 1

    threading.Thread(target=schedule, daemon=True).start()
    last_print = 0.0
    while time.monotonic() - start < args.duration:
        time.sleep(5)
        t = time.monotonic() - start
        rss.append((round(t), rss_kb(args.pid)))
        if t - last_print >= 30:
            last_print = t
            with load.lock:
                done = sum(load.outcomes.values())
                bad = sum(v for k, v in load.outcomes.items() if k.startswith(("failed", "error")))
            print(f"[{t:5.0f} s] {done} requests, {bad} failed, rss {rss[-1][1] / 1024:.1f} MiB", file=sys.stderr)
    sender.join()
    time.sleep(3)  # the last answers
    with open(args.policy_file, "w") as f:
        f.write(original_policy)

    warm = [kb for t, kb in rss if t >= min(args.warmup, args.duration / 2)]
    growth = (warm[-1] - warm[0]) / warm[0] * 100 if len(warm) > 1 else float("nan")
    minute1 = [kb for t, kb in rss if t >= 60]
    growth_minute1 = (minute1[-1] - minute1[0]) / minute1[0] * 100 if len(minute1) > 1 else float("nan")
    lat = sorted(load.latencies)
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else float("nan")
    failures = {k: v for k, v in load.outcomes.items() if k.startswith(("failed", "error"))}
    report = {
        "rate": args.rate, "duration_s": args.duration, "requests": sum(load.outcomes.values()),
        "outcomes": dict(load.outcomes), "failures": failures, "faults": dict(faults),
        "latency_ms": {"p50": p(0.5), "p99": p(0.99), "max": p(1.0)},
        "rss_kb": rss, "warmup_s": args.warmup, "rss_growth_after_warmup_pct": growth,
        "rss_growth_after_minute1_pct": growth_minute1,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(f"requests {report['requests']} at {args.rate}/s for {args.duration:.0f} s")
    for k, v in sorted(load.outcomes.items()):
        print(f"  {k:40s} {v}")
    print("faults (not the load):")
    for k, v in sorted(faults.items()):
        print(f"  {k:40s} {v}")
    print(f"latency p50 {p(0.5):.1f} ms, p99 {p(0.99):.1f} ms, max {p(1.0):.1f} ms (from the intended send time)")
    print("RSS by minute (MiB):", " ".join(f"{kb / 1024:.1f}" for t, kb in rss if t % 60 == 0))
    print(f"RSS {warm[0] / 1024 if warm else 0:.1f} MiB after the {args.warmup:.0f} s warm-up -> {rss[-1][1] / 1024:.1f} MiB at the end: {growth:+.1f} % ({growth_minute1:+.1f} % from minute 1)")
    ok = not failures and growth < 5
    print("PASS" if ok else "FAIL: " + ("failed requests " + json.dumps(failures) if failures else f"RSS growth {growth:.1f} %"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
