"""The split of a data refresh (round 6): a model that continues from a served one must be validated on rows it never
trained on, but ml_prepare.py's split moves when rows are added (strata shift).

Usage: ml_refresh_split.py OLD_DATA NEW_DATA OUT [NEW_SRC_PREFIX REPEAT]
  OLD_DATA  ml_prepare.py output the served model was trained on (train.jsonl, val.jsonl)
  NEW_DATA  ml_prepare.py output with the new rows
  OUT       -> train.jsonl, val.jsonl: every OLD validation row stays in validation, every OLD training row in
            training, a new row where NEW_DATA put it; training rows whose `src` starts with NEW_SRC_PREFIX
            (e.g. ml_r6; several comma-separated, e.g. ml_r1,ml_r2 for rounds 10-29) are written REPEAT times
            (default: ml_r6, 3).
"""
import json, os, sys

old, new, out = sys.argv[1:4]
prefixes = tuple((sys.argv[4] if len(sys.argv) > 4 else "ml_r6").split(","))
repeat = int(sys.argv[5]) if len(sys.argv) > 5 else 3
rd = lambda p: [json.loads(l) for l in open(p, encoding="utf-8") if l.strip()]
old_val = {r["text"] for r in rd(os.path.join(old, "val.jsonl"))}
old_train = {r["text"] for r in rd(os.path.join(old, "train.jsonl"))}
new_val = {r["text"] for r in rd(os.path.join(new, "val.jsonl"))}
train, val = [], []
for r in rd(os.path.join(new, "train.jsonl")) + rd(os.path.join(new, "val.jsonl")):
    t = r["text"]
    if t in old_val or (t not in old_train and t in new_val):
        val.append(r)
    else:
        train += [r] * (repeat if r.get("src", "").startswith(prefixes) else 1)
os.makedirs(out, exist_ok=True)
for name, rows in (("train", train), ("val", val)):
    with open(os.path.join(out, name + ".jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
print(f"train {len(train)} (with repeats) / val {len(val)} -> {out}")
