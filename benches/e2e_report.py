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
CONFIGS = ["tg-off", "tg-on", "tg-1x2-off", "tg-1x2", "tg-before", "py-1w", "py-2w"]
# the model's thread layout per server: which raw single inference it compares with
LAYOUT_OF = {"tg-off": "1x1", "tg-on": "1x1", "tg-1x2": "1x2", "tg-1x2-off": "1x2", "py-1w": "1x2", "py-2w": "1x1", "tg-before": "1x1"}
NAMES = {
    "tg-off": "tiergate 2x1, batching off",
    "tg-on": "tiergate 2x1, batching on",
    "tg-1x2-off": "tiergate 1x2, batching off",
    "tg-1x2": "tiergate 1x2, batching on (shipped defaults)",
    "tg-before": "tiergate at an earlier commit, as it shipped (E2E_BEFORE)",
    "py-1w": "FastAPI, 1 worker x 2 threads",
    "py-2w": "FastAPI, 2 workers x 1 thread",
}


def load_jsonl(path):
    if not path.exists():
        return []
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


LAYOUTS = {"1x2": 1, "2x1": 2, "1x1": 1}  # sequences per iteration = batch x this


def ceiling(run):
    """{kind: {layout: {batch: (median ms per call, sequences/s)}}} from criterion's estimates
    (median) of the ceiling_stream groups of benches/ceiling.rs."""
    out = {}
    for kind in ("short", "long"):
        for layout, mult in LAYOUTS.items():
            d = run / "criterion" / f"ceiling_stream_{kind}_{layout}"
            for b in (1, 2, 4, 8, 16, 32):
                est = d / str(b) / "new" / "estimates.json"
                if est.exists():
                    ns = json.loads(est.read_text())["median"]["point_estimate"]
                    out.setdefault(kind, {}).setdefault(layout, {})[b] = (ns / 1e6, mult * b / (ns / 1e9))
    return out


def best_ceiling(ceil, kind):
    """(layout, batch, sequences/s) of the fastest 1x2/2x1 cell for `kind`, or None."""
    best = None
    for layout in ("1x2", "2x1"):
        c = ceil.get(kind, {}).get(layout, {})
        for b, (_, tput) in c.items():
            if best is None or tput > best[2]:
                best = (layout, b, tput)
    return best


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
    table = (run / "table.txt").read_text() if (run / "table.txt").exists() else ""
    discarded = table.count("(discarded)")
    p("Every measurement started on an idle machine (no rustc/cargo running, CPU < 15 % busy; the first one "
      "also with a 1-min load average < 0.5); rustc/cargo were polled every second during the run and a "
      f"measurement that overlapped one was discarded and repeated ({discarded} discarded this run).\n")

    # ---- ceiling
    best = {}  # kind -> (layout, batch, sequences/s)
    raw1 = {}  # (kind, layout) -> ms of one batch-1 inference alone
    p("## Raw ONNX Runtime ceiling on the same message stream (tokenisation included, no HTTP, no queue)\n")
    p("`cargo bench --bench ceiling -- stream`: all messages of each kind in file order, consecutive batches "
      "(padded to the longest of the batch, as in the server); two layouts of the same 2 threads: one session "
      "with 2 intra-op threads (1x2), two sessions of 1 thread running in parallel (2x1); 1x1 = one inference "
      "alone on one thread. Cell: median time per call / sequences per second.\n")
    p("| texts | layout | " + " | ".join(f"batch {b}" for b in (1, 2, 4, 8, 16)) + " |")
    p("| --- " * 7 + "|")
    for kind in ("short", "long"):
        for layout in ("1x2", "2x1", "1x1"):
            c = ceil.get(kind, {}).get(layout, {})
            if not c:
                continue
            p(f"| {kind} | {layout} | " + " | ".join(f"{c[b][0]:.2f} ms / {c[b][1]:.0f}/s" if b in c else "" for b in (1, 2, 4, 8, 16)) + " |")
            if 1 in c:
                raw1[(kind, layout)] = c[1][0]
        if best_ceiling(ceil, kind):
            best[kind] = best_ceiling(ceil, kind)
    p("")
    for kind, (layout, b, tput) in best.items():
        p(f"- {kind}: ceiling **{tput:.0f} sequences/s** ({layout}, batch {b}); 90 % of it: {0.9 * tput:.0f}/s")
    p("")

    # ---- unloaded
    p("## Unloaded: one request at a time (20 requests/s, open loop)\n")
    p("p50 from the intended send time includes up to 1 ms of the load generator's timer lag; "
      "service p50 is from the actual send to the response.\n")
    p("| server | texts | p50 | service p50 | p99 | one raw inference, same layout (median) | service p50 - raw |")
    p("| --- | --- | --- | --- | --- | --- | --- |")
    unl = {}
    for r in unloaded:
        name, kind, _ = r["label"].split("/")
        unl[(name, kind)] = r
        raw = raw1.get((kind, LAYOUT_OF.get(name, "1x2")))
        if raw is None:
            p(f"| {NAMES.get(name, name)} | {kind} | {r['p50_ms']:.2f} ms | {r['service_p50_ms']:.2f} ms | {r['p99_ms']:.2f} ms | - | - |")
            continue
        p(f"| {NAMES.get(name, name)} | {kind} | {r['p50_ms']:.2f} ms | {r['service_p50_ms']:.2f} ms | {r['p99_ms']:.2f} ms | "
          f"{raw:.2f} ms ({LAYOUT_OF.get(name, '1x2')}) | {r['service_p50_ms'] - raw:+.2f} ms |")
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
          "`sat` = saturated (goodput < 90 % of offered or p99 > 1 s; the sweep stops after two in a row); "
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
            ceil_t = best.get(kind, (None, None, None))[2]
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
        s, c = sustainable[("tg-on", kind)], best[kind][2]
        return f"{'met' if s >= 0.9 * c else 'MISSED'}: {s:.0f}/s = {100 * s / c:.0f} % of {c:.0f}/s"

    def t_python(kind, tgc="tg-on"):
        losses = []
        for rate, tg in by[(tgc, kind)].items():
            for py in ("py-1w", "py-2w"):
                r = by.get((py, kind), {}).get(rate)
                if r is None:
                    continue  # the Python sweep had stopped: saturated at a lower rate
                if not (tg["p99_ms"] < r["p99_ms"] and tg["goodput_rps"] >= 0.99 * r["goodput_rps"]):
                    losses.append(f"{rate:g}/s vs {py}")
        return f"{tgc}: " + ("met: lower p99 and >= goodput at every rate" if not losses else "MISSED at " + ", ".join(losses))

    def t_batching(kind):
        parts = []
        for on_c, off_c, layout in (("tg-on", "tg-off", "2x1"), ("tg-1x2", "tg-1x2-off", "1x2")):
            if (on_c, kind) in sustainable and (off_c, kind) in sustainable:
                on, off = sustainable[(on_c, kind)], sustainable[(off_c, kind)]
                ratio = on / off if off else float("inf")
                parts.append(f"{layout} {'met' if ratio >= 1.5 else 'MISSED'}: {on:.0f} / {off:.0f} = {ratio:.2f}x")
        return "; ".join(parts) or "not measured"

    def t_unloaded(kind):
        parts, worst = [], 0.0
        for c in ("tg-off", "tg-on", "tg-1x2-off", "tg-1x2"):
            if (c, kind) not in unl:
                continue
            r, raw = unl[(c, kind)], raw1[(kind, LAYOUT_OF[c])]
            d = r["service_p50_ms"] - raw
            worst = max(worst, d)
            parts.append(f"{c} {r['service_p50_ms']:.2f} vs {raw:.2f} ms ({d:+.2f})")
        return f"{'met' if worst <= 1.0 else 'MISSED'}: " + ", ".join(parts)

    def t_rss(kind):
        m = max((max((r["server_rss_peak_mb"] or 0), (r["server_hwm_mb"] or 0))
                 for c in ("tg-off", "tg-on", "tg-1x2-off", "tg-1x2") if (c, kind) in by for r in by[(c, kind)].values()),
                default=None)
        if m is None:
            return "not measured"
        return f"{'met' if m <= 250 else 'MISSED'}: {m:.0f} MB at most"

    p(f"| tiergate (batching on) >= 90 % of the ceiling at p99 < {P99_BOUND_MS:.0f} ms | {cell('short', t_ceiling)} | {cell('long', t_ceiling)} |")
    for tgc in ("tg-on", "tg-off"):
        p(f"| beats the Python baseline at every load level (lower p99, >= goodput, vs both workers settings) | "
          f"{cell('short', lambda k: t_python(k, tgc))} | {cell('long', lambda k: t_python(k, tgc))} |")
    p(f"| batching on vs off >= 1.5x sustainable throughput | {cell('short', t_batching)} | {cell('long', t_batching)} |")
    p(f"| unloaded p50 within 1 ms of one raw inference (service p50) | {cell('short', t_unloaded)} | {cell('long', t_unloaded)} |")
    p(f"| resident memory under load <= 250 MB (tiergate, VmRSS peak / VmHWM) | {cell('short', t_rss)} | {cell('long', t_rss)} |")
    p("")
    overload(run, best, sustainable)


def overload(run, best, sustainable):
    """The overload section: 1.5x / 3x the sustainable rate and the burst (benches/e2e.sh step 5)."""
    rows = load_jsonl(run / "overload.jsonl")
    if not rows:
        return
    shipped = (run / "shipped.txt").read_text().strip() if (run / "shipped.txt").exists() else "tg-off"
    # sequences/s of the 2x1 layout at batch 1: what max_batch = 1 can reach
    b1_ceiling = {k: c["2x1"][1][1] for k, c in ceiling(run).items() if 1 in c.get("2x1", {})}
    p = print
    p("## Overload: 1.5x and 3x the sustainable rate, and a burst\n")
    p("Model goodput = answers from the model tier per second; rules = answers decided by rules because the model "
      "tier could not serve them in time (tiergate: skipped at admission, shed, not started, or timed out); late = "
      "answers later than the 200 ms deadline + 5 ms; recovery = from the end of the 3x phase of the burst until "
      "p99 stays under 50 ms (100 ms bins).\n")
    p("| server | texts | point | offered/s | model goodput/s | % of ceiling | rules/s | rules p50 / p99 ms | "
      "model p99 ms | late | errors+timeouts | recovery s |")
    p("| --- " * 12 + "|")
    verdicts = []
    for r in rows:
        name, kind, point = r["label"].split("/")
        ceil = best.get(kind, (None, None, None))[2]
        span = r["duration_s"] or 1
        pct = f"{100 * r['goodput_rps'] / ceil:.0f} %" if ceil else "-"
        rec = "-" if r.get("recovery_s") is None else f"{r['recovery_s']:.1f}"
        p(f"| {NAMES.get(name, name)} | {kind} | {point} | {r['offered_rps']:g} | {r['goodput_rps']:.0f} | {pct} | "
          f"{r['degraded'] / span:.0f} | {fmt(r['degraded_p50_ms'], 2)} / {fmt(r['degraded_p99_ms'], 2)} | "
          f"{fmt(r['ok_p99_ms'])} | {r['late'] if r.get('late') is not None else '-'} | "
          f"{r['errors'] + r['timeouts'] + r['unsent']} | {rec} |")
        if name != shipped or not ceil:
            continue
        if point != "burst":
            good = r["goodput_rps"] >= 0.9 * ceil
            b1 = b1_ceiling.get(kind)
            b1_txt = f"; {100 * r['goodput_rps'] / b1:.0f} % of the batch-1 ceiling {b1:.0f}/s" if b1 else ""
            fast = r["degraded"] == 0 or r["degraded_p99_ms"] <= 5.0
            verdicts.append(f"- {kind} {point}: model goodput {'met' if good else 'MISSED'} "
                            f"({r['goodput_rps']:.0f}/s vs 90 % of {ceil:.0f}/s{b1_txt}); excess answered in <= 5 ms p99 "
                            f"{'met' if fast else 'MISSED'} ({fmt(r['degraded_p99_ms'], 2)} ms); no answer later than "
                            f"deadline + 5 ms {'met' if r.get('late') == 0 else 'MISSED'} ({r.get('late')})")
        else:
            ok = r.get("recovery_s") is not None and r["recovery_s"] <= 1.0
            verdicts.append(f"- {kind} burst: p99 under 50 ms within 1 s after it {'met' if ok else 'MISSED'} "
                            f"({rec} s); late {r.get('late')}")
    p("")
    for kind in ("short", "long"):
        if (shipped, kind) in sustainable and kind in best:
            s, c = sustainable[(shipped, kind)], best[kind][2]
            verdicts.append(f"- {kind}: sustained throughput at p99 < 50 ms >= 85 % of the ceiling "
                            f"{'met' if s >= 0.85 * c else 'MISSED'} ({s:.0f}/s = {100 * s / c:.0f} % of {c:.0f}/s)")
    if verdicts:
        p(f"Targets (tiergate, shipped settings: {NAMES.get(shipped, shipped)}):\n")
        p("\n".join(verdicts))
        p("")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--ceiling":
        # benches/e2e.sh: the ceiling (sequences/s) of one kind, to choose its rates; empty if not measured
        b = best_ceiling(ceiling(Path(sys.argv[2])), sys.argv[3])
        print(f"{b[2]:.0f}" if b else "")
    else:
        main()
