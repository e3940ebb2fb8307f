"""Data step of the multilingual recipe.

Usage: ml_prepare.py OUT_DIR [TOKENIZER_JSON]
  reads   models/recipe/data/modern_*.jsonl (English, lang "en"), models/recipe/seed_short.jsonl (English, kind "seed"),
          models/recipe/data/ml_*.jsonl (team-written multilingual: text, label, kind, lang, writer; whatever is there now),
          optionally $SA_DIR/sa_{train,val}.jsonl (the old recipe's prepared SpamAssassin splits; lang "en", kind "sa")
  check sets (read programmatically, only their text, only for dedup; never printed): tests/data/*.jsonl
  (and CHECK_SETS_EXTRA)
  writes  OUT_DIR/train.jsonl, val.jsonl (text, label, kind, lang, src, window), dedup.json, data_stats.json

Dedup, in this order:
  1. exact: normalised text (NFKC, lower-case, digits removed, whitespace collapsed); first occurrence kept
  2. near-duplicates inside the data: MinHash (datasketch, 128 perms) over character 5-gram shingles of the normalised
     text, LSH threshold 0.8, confirmed by the exact shingle Jaccard >= 0.8; first occurrence (file order) kept
  3. against every check-set row: exact normalised match, or character 5-gram Jaccard >= CHECK_T (0.5 by default,
     stricter than the internal 0.8: anything close to a check-set row goes) -> dropped
Split: seeded, stratified by lang + label, with kinds spread evenly (rows of a lang+label stratum ordered by kind then a
seeded random key; every k-th row -> val, VAL_FRAC = 0.15). The dedup runs before the split, so no near-duplicate pair
straddles train/val.
"""
import glob, hashlib, json, os, random, re, sys, time, unicodedata
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OUT = sys.argv[1]
TOK = sys.argv[2] if len(sys.argv) > 2 else None
SEED = 1234
VAL_FRAC = float(os.environ.get("VAL_FRAC", 0.15))
NEAR_T = float(os.environ.get("NEAR_T", 0.8))
CHECK_T = float(os.environ.get("CHECK_T", 0.5))
SH = 5
os.makedirs(OUT, exist_ok=True)
t0 = time.time()

def read_jsonl(p):
    out = []
    for l in open(p, encoding="utf-8"):
        l = l.strip()
        if not l: continue
        try: out.append(json.loads(l))
        except json.JSONDecodeError: pass          # a file being written right now may end in a partial line
    return out

def norm(t):
    t = unicodedata.normalize("NFKC", t).lower()
    t = re.sub(r"\d+", "", t)
    return re.sub(r"\s+", " ", t).strip()

def shingles(t):
    n = norm(t)
    if len(n) < SH: return {n}
    return {n[i:i + SH] for i in range(len(n) - SH + 1)}

# ---------------- load
rows = []
def add(src, rs, lang=None, kind=None):
    for r in rs:
        if not isinstance(r.get("text"), str) or r.get("label") not in (0, 1) or not r["text"].strip(): continue
        rows.append({"text": r["text"], "label": int(r["label"]), "kind": r.get("kind") or kind or "none",
                     "lang": r.get("lang") or lang or "und", "src": src, "writer": r.get("writer", "")})
for p in sorted(glob.glob(os.path.join(HERE, "data", "modern_*.jsonl"))):
    add(os.path.basename(p), read_jsonl(p), lang="en")
add("seed_short.jsonl", read_jsonl(os.path.join(HERE, "seed_short.jsonl")), lang="en", kind="seed")
sa = os.environ.get("SA_DIR")
if sa:
    for part in ("sa_train", "sa_val"):
        add(part, read_jsonl(os.path.join(sa, part + ".jsonl")), lang="en", kind="sa")
ml_files = sorted(p for p in glob.glob(os.path.join(HERE, "data", "ml_*.jsonl")) if not p.endswith(".review.jsonl"))
for p in ml_files:
    add(os.path.basename(p), read_jsonl(p))
loaded = Counter(r["src"] for r in rows)
# review files (data/ml_*.review.jsonl: text, old_label, new_label, [new_lang], reason) written by the team's reviewers:
# new_label null -> the row is dropped (ambiguous), else relabelled; new_lang -> lang corrected. Matched on the exact text.
reviews = {}
review_files = sorted(glob.glob(os.path.join(HERE, "data", "ml_*.review.jsonl")))
for p in review_files:
    for r in read_jsonl(p):
        if isinstance(r.get("text"), str) and "new_label" in r: reviews[r["text"]] = r
REV = {"files": [os.path.basename(p) for p in review_files], "entries": len(reviews), "dropped": 0, "relabelled": 0,
       "lang_changed": 0, "unmatched": 0}
matched = set(); rows_r = []
for r in rows:
    v = reviews.get(r["text"])
    if v is None: rows_r.append(r); continue
    matched.add(r["text"])
    if v["new_label"] is None: REV["dropped"] += 1; continue
    if v["new_label"] in (0, 1) and v["new_label"] != r["label"]: r["label"] = int(v["new_label"]); REV["relabelled"] += 1
    if v.get("new_lang") and v["new_lang"] != r["lang"]: r["lang"] = v["new_lang"]; REV["lang_changed"] += 1
    rows_r.append(r)
REV["unmatched"] = len(set(reviews) - matched)
rows = rows_r
print("reviews", REV, flush=True)
print("loaded", len(rows), dict(loaded), flush=True)

# ---------------- check sets (text only; never printed)
# Every check set lives in tests/data (the blind sets too, committed with their sha256 before
# their first measurement); CHECK_SETS_EXTRA adds files that are not committed yet (":"-separated).
check_files = sorted(set(glob.glob(os.path.join(REPO, "tests", "data", "*.jsonl"))
                         + [p for p in os.environ.get("CHECK_SETS_EXTRA", "").split(":") if p]))
check = []
for p in check_files:
    for r in read_jsonl(p):
        t = r.get("text") if isinstance(r, dict) else None
        if isinstance(t, str) and t.strip(): check.append(t)
check_by_file = {os.path.relpath(p, REPO): 0 for p in check_files}

# ---------------- 1. exact
D = {"exact_internal": 0, "near_internal": 0, "check_exact": 0, "check_near": 0}
seen = set(); rows1 = []
for r in rows:
    k = norm(r["text"])
    if k in seen: D["exact_internal"] += 1; continue
    seen.add(k); rows1.append(r)

# ---------------- 2. near-duplicates inside the data
from datasketch import MinHash, MinHashLSH
def mh(sh):
    m = MinHash(num_perm=128, seed=SEED)
    m.update_batch([s.encode("utf-8") for s in sh]); return m
def jac(a, b): return len(a & b) / max(1, len(a | b))
lsh = MinHashLSH(threshold=NEAR_T, num_perm=128)
rows2 = []; shs = []; near_pairs = Counter()
for i, r in enumerate(rows1):
    sh = shingles(r["text"]); m = mh(sh)
    dup = None
    for key in lsh.query(m):
        if jac(sh, shs[key]) >= NEAR_T: dup = key; break
    if dup is not None:
        D["near_internal"] += 1; near_pairs[(rows2[dup]["src"], r["src"])] += 1; continue
    lsh.insert(len(rows2), m); rows2.append(r); shs.append(sh)

# ---------------- 3. against the check sets
lsh_c = MinHashLSH(threshold=CHECK_T, num_perm=128)
c_norm = set(); c_sh = []
for j, t in enumerate(check):
    c_norm.add(norm(t)); s = shingles(t); c_sh.append(s); lsh_c.insert(j, mh(s))
rows3 = []; drop_by_src = Counter()
for r, sh in zip(rows2, shs):
    if norm(r["text"]) in c_norm:
        D["check_exact"] += 1; drop_by_src[r["src"]] += 1; continue
    if any(jac(sh, c_sh[j]) >= CHECK_T for j in lsh_c.query(mh(sh))):
        D["check_near"] += 1; drop_by_src[r["src"]] += 1; continue
    rows3.append(r)
D.update({"reviews": REV, "loaded": sum(loaded.values()), "after_reviews": len(rows), "after_exact": len(rows1), "after_near": len(rows2), "after_check": len(rows3),
          "near_threshold": NEAR_T, "check_threshold": CHECK_T, "shingles": f"character {SH}-grams of NFKC lower-case, digits removed",
          "check_sets": {"files": len(check_files), "rows": len(check)},
          "check_drops_by_source": dict(drop_by_src),
          "near_internal_by_pair": {f"{a} <- {b}": n for (a, b), n in near_pairs.most_common(20)}})
print("dedup", {k: v for k, v in D.items() if not isinstance(v, dict)}, flush=True)

# ---------------- split
rnd = random.Random(SEED)
strata = defaultdict(list)
for r in rows3:
    strata[(r["lang"], r["label"])].append(r)
train, val = [], []
for key in sorted(strata):
    rs = strata[key]
    keyed = sorted(rs, key=lambda r: (r["kind"], hashlib.sha1((str(SEED) + r["text"]).encode()).hexdigest()))
    k = max(2, round(1 / VAL_FRAC))
    off = rnd.randrange(k)
    for i, r in enumerate(keyed):
        (val if (len(keyed) >= 3 and i % k == off) else train).append(r)

# ---------------- windows (as the old recipe: long texts -> first window; 'long'/'buried' risk kinds -> last window)
if TOK:
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(TOK)
    for part in (train, val):
        for r, e in zip(part, tk.encode_batch([r["text"] for r in part])):
            r["n_tokens"] = len(e.ids)
for r in train + val:
    long_kind = ("long" in r["kind"] or "buried" in r["kind"]) and r["label"] == 1
    r["window"] = "last" if long_kind else "first"
rnd.shuffle(train)
for name, part in (("train", train), ("val", val)):
    with open(os.path.join(OUT, name + ".jsonl"), "w", encoding="utf-8") as fh:
        for r in part: fh.write(json.dumps(r, ensure_ascii=False) + "\n")

def stats(part):
    s = defaultdict(lambda: [0, 0])
    for r in part: s[r["lang"]][r["label"]] += 1
    return {k: {"ok": v[0], "risk": v[1]} for k, v in sorted(s.items())}
S = {"train": len(train), "val": len(val), "train_by_lang": stats(train), "val_by_lang": stats(val),
     "ml_files": [os.path.basename(p) for p in ml_files], "loaded_by_source": dict(loaded),
     "kinds": len({r["kind"] for r in rows3}), "seconds": round(time.time() - t0, 1)}
if TOK:
    import statistics
    S["mean_tokens_train"] = round(statistics.mean(r["n_tokens"] for r in train), 1)
    S["frac_over_128_tokens"] = round(sum(r["n_tokens"] > 128 for r in train + val) / max(1, len(train) + len(val)), 3)
json.dump(D, open(os.path.join(OUT, "dedup.json"), "w"), indent=1)
json.dump(S, open(os.path.join(OUT, "data_stats.json"), "w"), indent=1)
print(json.dumps(S, indent=1), flush=True)
