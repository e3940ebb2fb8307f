#!/usr/bin/env python3
"""Measure a labelled check set through a running tiergate (the whole cascade: bundled policy,
guards, rules, model) and report what issue 26's "done when" asks, per language and per kind.

Usage:
    tiergate serve &                      # the model and policy under test, on 127.0.0.1:8080
    python3 models/recipe/blind_report.py tests/data/blind_ml.jsonl --out report.json [--md report.md]

Input: JSON lines {"text", "label": "risk"|"ok" (or 1|0), "lang"?, "kind"?}.
Metrics (stdlib only):
- label accuracy: the decision's label against the truth, whatever the action;
- risk allowed / ok blocked / review share;
- per language: accuracy with its Wilson 95 % interval (Wilson 1927; the usual interval for a
  binomial proportion, sound at small n and near 0 or 1);
- the cpu tier's calibrated risk scores wherever it gave one (the first path step of tier
  "cpu" with a risk_score, unless set aside for its language): ECE with 10 equal-width bins of confidence (Guo et al. 2017), and the
  share of wrong labels among cpu verdicts at confidence >= 0.95;
- every miss (risk allowed, ok blocked, wrong label) with its language, kind and path.
Measure a blind set once, as written, before any tuning, and report that number.
"""

import argparse
import collections
import concurrent.futures
import json
import math
import sys
import urllib.request

RANK = {"allow": 0, "review": 1, "block": 2}


def classify(url, text, timeout):
    body = json.dumps({"text": text}).encode()
    req = urllib.request.Request(url, body, {"content-type": "application/json", "x-tiergate-deadline-ms": "5000"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def wilson(k, n, z=1.96):
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def ece(pairs, bins=10):
    """pairs: (confidence of the predicted label, predicted label is right)."""
    if not pairs:
        return None
    total = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        inb = [(c, ok) for c, ok in pairs if (lo < c <= hi) or (b == 0 and c == 0)]
        if inb:
            conf = sum(c for c, _ in inb) / len(inb)
            acc = sum(1 for _, ok in inb if ok) / len(inb)
            total += len(inb) / len(pairs) * abs(conf - acc)
    return total


def truth(row):
    label = row["label"]
    return "risk" if label in ("risk", 1, "1") else "ok"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input")
    ap.add_argument("--url", default="http://127.0.0.1:8080/v1/classify")
    ap.add_argument("--out", required=True, help="JSON report")
    ap.add_argument("--md", help="Markdown tables")
    ap.add_argument("--decisions", help="JSON lines: each row's lang, kind, truth and whole decision (to study, not to tune on a blind set)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args()

    rows = [json.loads(l) for l in open(args.input, encoding="utf-8") if l.strip()]
    decisions = [None] * len(rows)
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
        futures = {pool.submit(classify, args.url, r["text"], args.timeout): i for i, r in enumerate(rows)}
        for done, f in enumerate(concurrent.futures.as_completed(futures), 1):
            decisions[futures[f]] = f.result()
            if done % 50 == 0 or done == len(rows):
                print(f"\r{done}/{len(rows)} classified", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    if args.decisions:
        with open(args.decisions, "w", encoding="utf-8") as f:
            for row, d in zip(rows, decisions):
                keep = {"lang": row.get("lang"), "kind": row.get("kind"), "truth": truth(row), "decision": d}
                f.write(json.dumps(keep, ensure_ascii=False) + "\n")

    by_lang = collections.defaultdict(lambda: [0, 0])
    by_kind = collections.defaultdict(lambda: [0, 0])
    tiers = collections.Counter()
    n = correct = risk_allowed = ok_blocked = reviews = 0
    cpu_pairs, high_conf, misses = [], [0, 0], []
    for row, d in zip(rows, decisions):
        t = truth(row)
        right = d["label"] == t
        n += 1
        correct += right
        risk_allowed += t == "risk" and d["action"] == "allow"
        ok_blocked += t == "ok" and d["action"] == "block"
        reviews += d["action"] == "review"
        tiers[d["tier"]] += 1
        lang, kind = row.get("lang", "?"), row.get("kind", "?")
        by_lang[lang][0] += 1
        by_lang[lang][1] += right
        by_kind[(t, kind)][0] += 1
        by_kind[(t, kind)][1] += right
        # A score the cascade set aside for its language (outcome "language") is not a verdict.
        cpu = next((s for s in d["path"] if s["tier"] == "cpu" and s.get("risk_score") is not None
                    and s.get("outcome") != "language"), None)
        if cpu is not None:
            p = cpu["risk_score"]
            predicted = "risk" if p >= 0.5 else "ok"
            conf = max(p, 1 - p)
            cpu_pairs.append((conf, predicted == t))
            if conf >= 0.95 and cpu["outcome"] == "accepted":
                high_conf[0] += 1
                high_conf[1] += predicted != t
        if not right or (t == "risk" and d["action"] == "allow") or (t == "ok" and d["action"] == "block"):
            misses.append({
                "lang": lang, "kind": kind, "truth": t, "label": d["label"], "action": d["action"],
                "tier": d["tier"], "rule": d.get("rule"), "risk_score": d.get("risk_score"),
                "path": [(s["tier"], s["outcome"], s.get("risk_score")) for s in d["path"]],
                "text": row["text"][:160],
            })

    langs = {
        lang: {"n": k_n, "accuracy": k_c / k_n, "wilson95": wilson(k_c, k_n)}
        for lang, (k_n, k_c) in sorted(by_lang.items())
    }
    report = {
        "input": args.input,
        "n": n,
        "label_accuracy": correct / n,
        "risk_allowed": risk_allowed,
        "risk_n": sum(1 for r in rows if truth(r) == "risk"),
        "ok_blocked": ok_blocked,
        "ok_n": sum(1 for r in rows if truth(r) == "ok"),
        "review_share": reviews / n,
        "deciding_tier": dict(tiers),
        "cpu_scored": len(cpu_pairs),
        "cpu_ece_10_bins": ece(cpu_pairs),
        "cpu_accepted_at_confidence_0_95": high_conf[0],
        "cpu_wrong_at_confidence_0_95": high_conf[1],
        "by_language": langs,
        "by_kind": {f"{t}:{k}": {"n": v[0], "correct": v[1]} for (t, k), v in sorted(by_kind.items())},
        "misses": misses,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, ensure_ascii=False, indent=1)
    summary = (
        f"n {n}: label accuracy {report['label_accuracy']:.3f}; risk allowed {risk_allowed}/{report['risk_n']}; "
        f"ok blocked {ok_blocked}/{report['ok_n']}; review {report['review_share']:.1%}; deciding tier {dict(tiers)}; "
        f"cpu scored {len(cpu_pairs)}, ECE {report['cpu_ece_10_bins'] if cpu_pairs else float('nan'):.3f}, "
        f"wrong at conf>=0.95 {high_conf[1]}/{high_conf[0]}"
    )
    print(summary)
    if args.md:
        lines = [summary, "", "| language | n | accuracy | 95 % interval |", "|---|---|---|---|"]
        for lang, v in langs.items():
            lo, hi = v["wilson95"]
            lines.append(f"| {lang} | {v['n']} | {v['accuracy']:.3f} | {lo:.2f}-{hi:.2f} |")
        with open(args.md, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
