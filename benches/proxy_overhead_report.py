"""Summary of benches/proxy_overhead.sh: latency nginx and tiergate add over direct, per rate.

Two views: from each request's intended send time (what a client sees, the generator's ~1 ms
timer granularity included) and service time (actual send to response, without it)."""
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1])]
by = {(r["label"], r["offered_rps"]): r for r in rows}
keys = ("p50_ms", "p99_ms", "service_p50_ms", "service_p99_ms")
print("\nadded over direct, ms: p50, p99 from the intended send time | service p50, p99")
print(f"{'rate/s':>7} | {'direct: p50':>11} {'p99':>6} {'svc p50':>7} {'svc p99':>7} | {'nginx adds':>29} | {'tiergate adds':>29} | err n/t")
for rate in sorted({r["offered_rps"] for r in rows}):
    d, n, t = (by.get((k, rate)) for k in ("direct", "nginx", "tiergate"))
    if not (d and n and t):
        continue
    added = lambda x: " ".join(f"{x[k] - d[k]:+.3f}" for k in keys)
    print(
        f"{rate:>7.0f} | {d['p50_ms']:>11.3f} {d['p99_ms']:>6.3f} {d['service_p50_ms']:>7.3f} {d['service_p99_ms']:>7.3f} | "
        f"{added(n):>29} | {added(t):>29} | {n['errors'] + n['timeouts']}/{t['errors'] + t['timeouts']}"
    )
