#!/usr/bin/env python3
"""Side-by-side report of one benches/e2e.sh run: `python3 benches/e2e_report.py target/e2e/<run>`.

Reads machine.txt, ceiling.txt (+ criterion's estimates under criterion/), results.jsonl and
unloaded.jsonl (one JSON line per rate from benches/openloop.rs) and prints Markdown: the raw
ceiling, the unloaded single request, the sweep per message kind, the sustainable throughput of
each server and the targets of the performance issue, each computed from this run only.
"""

import json
import re
import sys
from pathlib import Path

P99_BOUND_MS = 50.0
CONFIGS = ["tg-off", "tg-on", "py-1w", "py-2w"]
NAMES = {
    "tg-off": "tiergate, batching off",
    "tg-on": "tiergate, batching on",
    "py-1w": "FastAPI, 1 worker x 2 threads",
    "py-2w": "FastAPI, 2 workers x 1 thread",
}


def load_jsonl(path):
    if not path.exists():
        return []
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def ceiling(run):
    """{kind: {batch: (median_ms, seq_per_s)}} from criterion's estimates (median), else its stdout."""
    out = {}
    for kind in ("short", "long"):
        d = run / "criterion" / f"ceiling_{kind}_threads2"
        for b in (1, 2, 4, 8, 16, 32):
            est = d / str(b) / "new" / "estimates.json"
            if est.exists():
                ns = json.loads(est.read_text())["median"]["point_estimate"]
                out.setdefault(kind, {})[b] = (ns / 1e6, b / (ns / 1e9))
    if out:
        return out
    text = (run / "ceiling.txt").read_text() if (run / "ceiling.txt").exists() else ""
    unit = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}
    for m in re.finditer(r"ceiling/(short|long)/threads2/(\d+)\s+time:\s+\[\S+ \S+ (\S+) (\S+)", text):
        ms = float(m.group(3)) * unit[m.group(4)]
        b = int(m.group(2))
        out.setdefault(m.group(1), {})[b] = (ms, b / (ms / 1e3))
    return out


def fmt(x, nd=1):
    if x is None:
        return "-"
    if isinstance(x, float) and x >= 100:
        return f"{x:.0f}"
    return f"{x:.{nd}f}"


def main():
    run = Path(sys.argv[1])
    rows = load_jsonl(run / "results.jsonl")
    unloaded = load_jsonl(run / "unloaded.jsonl")
    ceil = ceiling(run)
    p = print
    p(f"# End-to-end run {run.name}\n")
    if (run / "machine.txt").exists():
        p("```\n" + (run / "machine.txt").read_text().strip() + "\n```\n")
    inter = (run / "interference.log")
    if inter.exists() and inter.read_text().strip():
        lines = inter.read_text().strip().splitlines()
        p(f"**Warning: a compiler ran during {len(lines)} 2-s samples of this run** (first: {lines[0]}).\n")
    else:
        p("No rustc/cargo ran during the measurements (sampled every 2 s); the run started on an idle machine.\n")

    # ---- ceiling
    best = {}
    p("## Raw ONNX Runtime ceiling (2 intra-op threads, tokenisation included)\n")
    p("| texts | " + " | ".join(f"batch {b}" for b in (1, 2, 4, 8, 16, 32)) + " |")
    p("| --- " * 7 + "|")
    for kind in ("short", "long"):
        c = ceil.get(kind, {})
        p(f"| {kind} | " + " | ".join(f"{c[b][0]:.2f} ms / {c[b][1]:.0f}/s" if b in c else "-" for b in (1, 2, 4, 8, 16, 32)) + " |")
        if c:
            b = max(c, key=lambda b: c[b][1])
            best[kind] = (b, c[b][1], c.get(1, (None,))[0])
    p("")
    for kind, (b, tput, _) in best.items():
        p(f"- {kind}: best batch {b}, **{tput:.0f} sequences/s**; 90 % of it: {0.9 * tput:.0f}/s")
    p("")

    # ---- unloaded
    p("## Unloaded: one request at a time (20 requests/s, open loop)\n")
    p("p50 from the intended send time includes up to 1 ms of the load generator's timer lag; "
      "service p50 is from the actual send to the response.\n")
    p("| server | texts | p50 | service p50 | p99 | raw batch-1 inference (median) | service p50 - raw |")
    p("| --- | --- | --- | --- | --- | --- | --- |")
    unl = {}
    for r in unloaded:
        name, kind, _ = r["label"].split("/")
        unl[(name, kind)] = r
        raw = best.get(kind, (None, None, None))[2]
        diff = f"{r['service_p50_ms'] - raw:+.2f} ms" if raw else "-"
        p(f"| {NAMES.get(name, name)} | {kind} | {r['p50_ms']:.2f} ms | {r['service_p50_ms']:.2f} ms | {r['p99_ms']:.2f} ms | "
          f"{raw:.2f} ms | {diff} |" if raw else f"| {name} | {kind} | {r['p50_ms']:.2f} | {r['service_p50_ms']:.2f} | {r['p99_ms']:.2f} | - | - |")
    p("")

    # ---- sweeps
    by = {}
    for r in rows:
        name, kind = r["label"].split("/")[:2]
        by.setdefault((name, kind), {})[r["offered_rps"]] = r
    sustainable = {}
    for kind in ("short", "long"):
        configs = [c for c in CONFIGS if (c, kind) in by]
        if not configs:
            continue
        rates = sorted({rate for c in configs for rate in by[(c, kind)]})
        p(f"## Open-loop sweep, {kind} messages\n")
        p("Each cell: goodput (model answers/s) · p50 · p99 latency in ms from the intended send time; "
          f"**bold** = sustained (goodput >= 99 % of offered, p99 < {P99_BOUND_MS:.0f} ms, no errors); "
          "`sat` = saturated (goodput < 90 % of offered or p99 > 1 s), sweep stopped; "
          "d = tiergate answers from its rules because the model tier was skipped, shed or out of time.\n")
        p("| offered/s | " + " | ".join(NAMES[c] for c in configs) + " |")
        p("| --- " * (len(configs) + 1) + "|")
        for rate in rates:
            cells = []
            for c in configs:
                r = by[(c, kind)].get(rate)
                if r is None:
                    cells.append("")
                    continue
                s = f"{r['goodput_rps']:.0f} · {fmt(r['p50_ms'])} · {fmt(r['p99_ms'])}"
                extra = []
                if r["degraded"]:
                    extra.append(f"{r['degraded']} d")
                if r["errors"]:
                    extra.append(f"{r['errors']} err")
                if r["timeouts"] or r["unsent"]:
                    extra.append(f"{r['timeouts'] + r['unsent']} tmo")
                if r["saturated"]:
                    extra.append("sat")
                if extra:
                    s += " (" + ", ".join(extra) + ")"
                cells.append(f"**{s}**" if r["sustained"] else s)
            p(f"| {rate:g} | " + " | ".join(cells) + " |")
        p("")
        p("| server | sustainable throughput | % of ceiling | server CPU at that rate | CPU ms / request | peak RSS (VmRSS, sampled) | VmHWM |")
        p("| --- | --- | --- | --- | --- | --- | --- |")
        for c in configs:
            ok = [r for r in by[(c, kind)].values() if r["sustained"]]
            top = max(ok, key=lambda r: r["goodput_rps"]) if ok else None
            sustainable[(c, kind)] = top["goodput_rps"] if top else 0.0
            ceil_t = best.get(kind, (None, None))[1]
            rss = max((r["server_rss_peak_mb"] or 0) for r in by[(c, kind)].values())
            hwm = max((r["server_hwm_mb"] or 0) for r in by[(c, kind)].values())
            if top:
                pct = f"{100 * top['goodput_rps'] / ceil_t:.0f} %" if ceil_t else "-"
                p(f"| {NAMES[c]} | {top['goodput_rps']:.0f}/s (offered {top['offered_rps']:g}) | {pct} | "
                  f"{top['server_cpu_cores']:.2f} cores | {top['server_cpu_ms_per_req']:.2f} | {rss:.0f} MB | {hwm:.0f} MB |")
            else:
                p(f"| {NAMES[c]} | none | - | - | - | {rss:.0f} MB | {hwm:.0f} MB |")
        p("")

    # ---- targets
    p("## Targets (ratios within this run)\n")
    p("| target | short | long |")
    p("| --- | --- | --- |")

    def cell(kind, f):
        try:
            return f(kind)
        except (KeyError, TypeError, ZeroDivisionError):
            return "not measured"

    def t_ceiling(kind):
        s, c = sustainable[("tg-on", kind)], best[kind][1]
        return f"{'met' if s >= 0.9 * c else 'MISSED'}: {s:.0f}/s = {100 * s / c:.0f} % of {c:.0f}/s"

    def t_python(kind):
        losses = []
        for rate, tg in by[("tg-on", kind)].items():
            for py in ("py-1w", "py-2w"):
                r = by.get((py, kind), {}).get(rate)
                if r is None:
                    continue  # the Python sweep had stopped: saturated at a lower rate
                if not (tg["p99_ms"] < r["p99_ms"] and tg["goodput_rps"] >= 0.99 * r["goodput_rps"]):
                    losses.append(f"{rate:g}/s vs {py}")
        return "met: lower p99 and >= goodput at every rate" if not losses else "MISSED at " + ", ".join(losses)

    def t_batching(kind):
        on, off = sustainable[("tg-on", kind)], sustainable[("tg-off", kind)]
        return f"{'met' if on >= 1.5 * off else 'MISSED'}: {on:.0f} / {off:.0f} = {on / off:.2f}x"

    def t_unloaded(kind):
        raw = best[kind][2]
        parts = []
        for c in ("tg-off", "tg-on"):
            r = unl[(c, kind)]
            d = r["service_p50_ms"] - raw
            parts.append(f"{c} {r['service_p50_ms']:.2f} ms ({d:+.2f})")
        worst = max(unl[(c, kind)]["service_p50_ms"] - raw for c in ("tg-off", "tg-on"))
        return f"{'met' if worst <= 1.0 else 'MISSED'}: " + ", ".join(parts) + f" vs raw {raw:.2f} ms"

    def t_rss(kind):
        m = max(max((r["server_rss_peak_mb"] or 0), (r["server_hwm_mb"] or 0))
                for c in ("tg-off", "tg-on") for r in by[(c, kind)].values())
        return f"{'met' if m <= 250 else 'MISSED'}: {m:.0f} MB at most"

    p(f"| tiergate (batching on) >= 90 % of the ceiling at p99 < {P99_BOUND_MS:.0f} ms | {cell('short', t_ceiling)} | {cell('long', t_ceiling)} |")
    p(f"| beats the Python baseline at every load level (p99 and goodput, both workers settings) | {cell('short', t_python)} | {cell('long', t_python)} |")
    p(f"| batching on vs off >= 1.5x sustainable throughput | {cell('short', t_batching)} | {cell('long', t_batching)} |")
    p(f"| unloaded p50 within 1 ms of one raw inference (service p50) | {cell('short', t_unloaded)} | {cell('long', t_unloaded)} |")
    p(f"| resident memory under load <= 250 MB (tiergate, VmRSS peak / VmHWM) | {cell('short', t_rss)} | {cell('long', t_rss)} |")


if __name__ == "__main__":
    main()
