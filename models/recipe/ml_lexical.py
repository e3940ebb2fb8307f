#!/usr/bin/env python3
"""The cpu tier's lexical model: a logistic regression over hashed character n-grams, whose
logit is combined with the encoder's (src/tier/lexical.rs reads what this writes).

    python ml_lexical.py train DATA_DIR OUT_DIR             # DATA_DIR/train.jsonl, val.jsonl (ml_prepare.py)
    python ml_lexical.py combine OUT_DIR VAL.jsonl:DECISIONS.jsonl  # fit the combination on validation
    python ml_lexical.py fixture OUT_DIR TEXTS.jsonl FIXTURE.jsonl   # texts + expected logits for the Rust test
    python ml_lexical.py valset DATA_DIR VAL.jsonl           # the validation split as blind_report.py reads it

Features (the definition src/tier/lexical.rs implements, code point for code point):
- the text lower-cased (Python str.lower = Rust str::to_lowercase, Unicode's full mappings),
  split on Unicode White_Space; each word padded with one space on each side;
- its character n-grams, n = 1..5 (scikit-learn's `char_wb` analyzer: a padded word of at most
  n characters gives itself once and ends that word's n-grams);
- each n-gram hashed with 64-bit FNV-1a over its UTF-8 bytes, modulo BUCKETS (2^20);
- per bucket: sublinear tf (1 + ln count) times smoothed idf (ln((1 + n) / (1 + df)) + 1, fitted
  on the training split), the vector L2-normalised (TF-IDF as scikit-learn computes it).
Model: scikit-learn LogisticRegression (L2, C = 4) on the training split; its validation accuracy
and AUROC are printed. Output: `lexical.bin` (little-endian f32: BUCKETS idf values, then BUCKETS
coefficients) and `lexical.json` (the parameters, the intercept, the combination).

Combination (`combine`): p(risk) = sigmoid(a * logit(p_encoder) + b * z_lexical + c), where
p_encoder is the encoder's calibrated risk score (temperature-scaled, riskiest window) and
z_lexical the lexical logit; a, b, c by logistic regression on the encoder's scores of the
validation split (`blind_report.py --decisions` through a server whose model directory has no
"lexical" in model.json). Never on a blind set, spent or not (issue 26: a blind set is never
tuned on).
"""

import json
import math
import os
import re
import sys

import numpy as np

BUCKETS = 1 << int(os.environ.get("LEXICAL_BUCKET_BITS", 20))
# The served model: n = 1..5, C = 4 (models/MODEL_CARD.md, "Lexical model"); the environment overrides both
# to measure variants.
MIN_N, MAX_N = 1, int(os.environ.get("LEXICAL_MAX_N", 5))
C = float(os.environ.get("LEXICAL_C", 4.0))
# Unicode White_Space (what Rust's char::is_whitespace reads), not Python's str.split set.
WS = re.compile("[\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")
FNV_OFFSET, FNV_PRIME, MASK64 = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


def fnv1a(b):
    h = FNV_OFFSET
    for x in b:
        h = ((h ^ x) * FNV_PRIME) & MASK64
    return h


def ngrams(text, min_n=MIN_N, max_n=MAX_N):
    for w in WS.split(text.lower()):
        if not w:
            continue
        w = " " + w + " "
        for n in range(min_n, max_n + 1):
            for i in range(max(len(w) - n + 1, 1)):
                yield w[i : i + n]
            if len(w) <= n:  # as scikit-learn: a word no longer than n gives itself, once
                break


class Hasher:
    def __init__(self, ngram_range=(MIN_N, MAX_N), buckets=BUCKETS):
        self.cache = {}
        self.ngram_range, self.buckets = tuple(ngram_range), buckets

    def counts(self, text):
        c = {}
        for g in ngrams(text, *self.ngram_range):
            b = self.cache.get(g)
            if b is None:
                b = self.cache[g] = fnv1a(g.encode("utf-8")) % self.buckets
            c[b] = c.get(b, 0) + 1
        return c


def matrix(hasher, texts, idf=None):
    from scipy.sparse import csr_matrix

    rows, cols, vals = [], [], []
    for i, t in enumerate(texts):
        for b, n in hasher.counts(t).items():
            rows.append(i), cols.append(b), vals.append(1.0 + math.log(n))
    m = csr_matrix((vals, (rows, cols)), shape=(len(texts), BUCKETS), dtype=np.float64)
    if idf is None:
        df = np.bincount(m.indices, minlength=BUCKETS)
        idf = np.log((1 + len(texts)) / (1 + df)) + 1.0
    m = m.multiply(idf).tocsr()
    norm = np.sqrt(m.multiply(m).sum(axis=1)).A1
    norm[norm == 0] = 1.0
    from scipy.sparse import diags

    return diags(1.0 / norm) @ m, idf


def load(path):
    return [json.loads(l) for l in open(path, encoding="utf-8") if l.strip()]


def train(data_dir, out_dir):
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    tr, va = load(f"{data_dir}/train.jsonl"), load(f"{data_dir}/val.jsonl")
    h = Hasher()
    x, idf = matrix(h, [r["text"] for r in tr])
    y = np.array([int(r["label"]) for r in tr])
    clf = LogisticRegression(C=C, max_iter=3000).fit(x, y)
    xv, _ = matrix(h, [r["text"] for r in va], idf)
    yv = np.array([int(r["label"]) for r in va])
    pv = clf.predict_proba(xv)[:, 1]
    val = {"n": len(va), "accuracy": float(((pv >= 0.5) == yv).mean()), "auroc": float(roc_auc_score(yv, pv))}
    print(f"train {len(tr)} rows, {x.nnz / len(tr):.0f} buckets per row; validation {val}", flush=True)
    os.makedirs(out_dir, exist_ok=True)
    with open(f"{out_dir}/lexical.bin", "wb") as f:
        f.write(idf.astype("<f4").tobytes())
        f.write(clf.coef_[0].astype("<f4").tobytes())
    meta = {
        "kind": "hashed character n-grams, TF-IDF, logistic regression (models/recipe/ml_lexical.py)",
        "weights": "lexical.bin",
        "buckets": BUCKETS,
        "ngram_range": [MIN_N, MAX_N],
        "intercept": float(clf.intercept_[0]),
        "c": C,
        "train_rows": len(tr),
        "validation": val,
        # Until `combine` runs: the encoder alone.
        "combine": {"encoder": 1.0, "lexical": 0.0, "bias": 0.0},
    }
    json.dump(meta, open(f"{out_dir}/lexical.json", "w"), indent=1)


class Lexical:
    """The served model, as src/tier/lexical.rs computes it (f32 weights, f64 sums)."""

    def __init__(self, out_dir):
        self.meta = json.load(open(f"{out_dir}/lexical.json"))
        w = np.fromfile(f"{out_dir}/lexical.bin", dtype="<f4").astype(np.float64)
        n = self.meta["buckets"]
        self.idf, self.coef = w[:n], w[n:]
        self.h = Hasher(self.meta["ngram_range"], n)

    def logit(self, text):
        c = self.h.counts(text)
        if not c:
            return self.meta["intercept"]
        b = np.fromiter(c.keys(), dtype=np.int64)
        v = (1.0 + np.log(np.fromiter(c.values(), dtype=np.float64))) * self.idf[b]
        return float(v @ self.coef[b] / np.sqrt(v @ v) + self.meta["intercept"])


def logit(p):
    p = min(max(p, 1e-7), 1 - 1e-7)
    return math.log(p / (1 - p))


def combine(out_dir, files):
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    lex = Lexical(out_dir)
    xs, ys = [], []
    for pair in files:
        source, decisions = pair.split(":")
        for s, r in zip(load(source), load(decisions), strict=True):
            cpu = [s for s in r["decision"]["path"] if s["tier"] == "cpu" and "risk_score" in s]
            if cpu:
                xs.append([logit(cpu[0]["risk_score"]), lex.logit(s["text"])])
                ys.append(1 if r["truth"] == "risk" else 0)
    x, y = np.array(xs), np.array(ys)
    # Nearly unregularised: three parameters on thousands of messages.
    m = LogisticRegression(C=1e4, max_iter=1000).fit(x, y)
    a, b, c = float(m.coef_[0][0]), float(m.coef_[0][1]), float(m.intercept_[0])
    p = m.predict_proba(x)[:, 1]
    print(f"{len(y)} scores from {len(files)} files: encoder AUROC {roc_auc_score(y, x[:, 0]):.4f}, "
          f"lexical {roc_auc_score(y, x[:, 1]):.4f}, combined {roc_auc_score(y, p):.4f}; a {a:.4f} b {b:.4f} c {c:.4f}")
    lex.meta["combine"] = {"encoder": a, "lexical": b, "bias": c, "fitted_on": [os.path.basename(f.split(":")[0]) for f in files], "n": len(y)}
    json.dump(lex.meta, open(f"{out_dir}/lexical.json", "w"), indent=1)


def fixture(out_dir, texts_path, out_path):
    lex = Lexical(out_dir)
    with open(out_path, "w", encoding="utf-8") as f:
        for r in load(texts_path):
            f.write(json.dumps({"text": r["text"], "logit": lex.logit(r["text"])}, ensure_ascii=False) + "\n")


def valset(data_dir, out_path, max_bytes=16000):
    """The validation split as {"text", "label": "risk"|"ok"} lines, without texts over max_bytes
    (tiergate refuses texts over max_text_bytes, 16,384)."""
    n = 0
    with open(out_path, "w", encoding="utf-8") as f:
        for r in load(f"{data_dir}/val.jsonl"):
            if len(r["text"].encode()) > max_bytes:
                continue
            row = {"text": r["text"], "label": "risk" if int(r["label"]) == 1 else "ok", "lang": r.get("lang")}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    print(f"{n} validation texts -> {out_path}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"train": train, "combine": lambda o, *f: combine(o, f), "fixture": fixture, "valset": valset}[cmd](*args)
