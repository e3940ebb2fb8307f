#!/usr/bin/env python3
"""Per-guard precision through a running tiergate: how often each policy guard fires on ordinary
messages (false blocks when its action is block) and on risk messages, over labelled sets.

Usage:
    tiergate serve &        # the policy under test, on 127.0.0.1:8080
    python3 models/recipe/guard_precision.py FILE.jsonl [FILE.jsonl ...] [--url URL] [--md out.md]

Input: JSON lines {"text", "label": "risk"|"ok" (or 1|0), "lang"?}. A guard "fires" on a message
when the decision's path has a step of tier "guard" naming it (a guard that raised the action, or
the one that decided). Reported per guard: its action in the policy's decision, fires on ok messages
(and among them blocks: the false blocks), fires on risk messages, precision = risk / all fires,
and the languages of the ok messages it fired on. A guard that blocks must have no false blocks on
legitimate look-alikes; one that has them belongs at `review` (issue 26, item 5).
Do not run it on a blind set before that set's one measurement as written.
"""
import argparse
import collections
import concurrent.futures
import json
import sys
import urllib.request


def classify(url, text):
    body = json.dumps({"text": text}).encode()
    req = urllib.request.Request(url, body, {"content-type": "application/json", "x-tiergate-deadline-ms": "5000"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--url", default="http://127.0.0.1:8080/v1/classify")
    ap.add_argument("--md")
    a = ap.parse_args()
    rows = []
    for f in a.files:
        for line in open(f, encoding="utf-8"):
            if line.strip():
                r = json.loads(line)
                label = r.get("label")
                rows.append((f, r["text"], 1 if label in (1, "risk") else 0, r.get("lang", "?")))
    stats = collections.defaultdict(lambda: {"ok": 0, "ok_blocked": 0, "risk": 0, "actions": collections.Counter(),
                                             "ok_langs": collections.Counter()})
    n_ok = sum(1 for r in rows if r[2] == 0)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for i, ((f, text, y, lang), d) in enumerate(zip(rows, pool.map(lambda r: classify(a.url, r[1]), rows))):
            fired = {s.get("rule") for s in d.get("path", []) if s.get("tier") == "guard" and s.get("rule")}
            for g in fired:
                s = stats[g]
                s["actions"][d["action"]] += 1
                if y:
                    s["risk"] += 1
                else:
                    s["ok"] += 1
                    s["ok_langs"][lang] += 1
                    s["ok_blocked"] += int(d["action"] == "block" and d.get("tier") == "guard" and d.get("rule") == g)
            if (i + 1) % 500 == 0:
                print(f"{i + 1}/{len(rows)}", file=sys.stderr, flush=True)
    lines = [f"{len(rows)} messages ({n_ok} ordinary) from {', '.join(a.files)}", "",
             "| guard | fires on risk | fires on ok | false blocks | precision | ok languages |",
             "|---|---|---|---|---|---|"]
    for g, s in sorted(stats.items()):
        fires = s["risk"] + s["ok"]
        langs = ", ".join(f"{k} {v}" for k, v in s["ok_langs"].most_common(5))
        lines.append(f"| `{g}` | {s['risk']} | {s['ok']} | {s['ok_blocked']} | {s['risk'] / fires:.3f} | {langs} |")
    out = "\n".join(lines)
    print(out)
    if a.md:
        open(a.md, "w").write(out + "\n")


if __name__ == "__main__":
    main()
