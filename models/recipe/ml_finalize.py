"""Student -> ONNX -> static INT8 (QDQ) -> checks -> batch invariance -> temperature -> per-language validation metrics.

Usage: ml_finalize.py DATA_DIR BASE_DIR STUDENT_CKPT_DIR OUT_DIR
  STUDENT_CKPT_DIR = ml_train.py's CKPT/student_L{n}: model.pt, or (run not finished) the latest resume.pt, so that the
  pipeline can be proven on an early checkpoint. Writes OUT_DIR/{NAME.onnx, tokenizer.json, model.json,
  calibration.json, ood.json, metrics.json}; never writes into models/ (the served files are replaced by hand after review).

Served mode = tiergate's cpu tier: one text at a time, first 128 tokens (</s> kept last), no padding.
Quantisation as the old recipe (finalize.py): quantize_static(QDQ, per_channel=True, weights QInt8), calibration = 300
seeded training windows fed one at a time, unpadded; candidates activations QUInt8 / QInt8 x MinMax (+ Percentile 99.999
with CANDIDATES=all); always kept in float: the attention-mask path (everything from the attention_mask input up to the
Adds that put the mask on the scores), the Softmaxes and the mask-weighted pooling (ml_common.mask_path_nodes). The
winner is the most accurate within 0.5 % of FP32 validation accuracy (within 0.2 % of it counts as a tie -> the fastest, 1 thread); otherwise LayerNorms are kept in
float too; dynamic INT8 only as a last resort (reported), or never with STATIC_ONLY=1 (the most accurate static candidate
then, its drop reported: the server batches only a batch-invariant model). The word-embedding Gather is quantised.
"""
import hashlib, json, os, random, shutil, sys, time
import numpy as np, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ml_common import (MLRiskClassifier, read_jsonl, tokenizer, window_ids, export_onnx, mask_path_nodes, ece_15, per_lang,
                       MAX_LEN, BOS, EOS, PAD)
from sklearn.metrics import roc_auc_score, f1_score, accuracy_score
from scipy.optimize import minimize_scalar

data, base, sckpt, out = sys.argv[1:5]
os.makedirs(out, exist_ok=True); work = os.path.join(out, "work"); os.makedirs(work, exist_ok=True)
torch.set_num_threads(2)
SEED = 4321
t_start = time.time()
from transformers import BertConfig
import re
_m = re.search(r"_L(\d+)", os.path.basename(sckpt.rstrip("/")))        # student_L2, student_L2_kd
N = int(_m.group(1)) if _m else int(os.environ.get("STUDENT_LAYERS", 4))
NAME = f"risk-ml-e5s-l{N}-int8"
cfg = BertConfig.from_pretrained(base); cfg.num_hidden_layers = N
model = MLRiskClassifier(config=cfg, attn="eager")
R = {"name": NAME, "layers": N, "max_seq_len": MAX_LEN}
mp = os.path.join(sckpt, "model.pt")
if os.path.exists(mp):
    model.load_state_dict(torch.load(mp, weights_only=False)); R["checkpoint"] = mp
else:
    s = torch.load(os.path.join(sckpt, "resume.pt"), weights_only=False); model.load_state_dict(s["model"])
    R["checkpoint"] = f"{sckpt}/resume.pt (unfinished: stage {s['stage']} step {s['step']})"
model.eval()
print("checkpoint", R["checkpoint"], flush=True)
tok_json = os.path.join(out, "tokenizer.json")
tj = json.load(open(os.path.join(base, "tokenizer.json"), encoding="utf-8")); tj["padding"] = None; tj["truncation"] = None
json.dump(tj, open(tok_json, "w", encoding="utf-8"), ensure_ascii=False)
tok = tokenizer(tok_json)

# ---------- export
fp32 = os.path.join(work, "fp32.onnx"); pre = os.path.join(work, "fp32_pre.onnx"); dyn = os.path.join(work, "dynamic_int8.onnx")
final = os.path.join(out, NAME + ".onnx")
export_onnx(model, fp32)
import onnx, onnxruntime as ort
from onnxruntime.quantization import (quantize_dynamic, quantize_static, QuantType, QuantFormat, CalibrationMethod,
                                      CalibrationDataReader)
from onnxruntime.quantization.shape_inference import quant_pre_process
quant_pre_process(fp32, pre, skip_symbolic_shape=True)
quantize_dynamic(pre, dyn, weight_type=QuantType.QInt8, per_channel=True)

# ---------- data
val = read_jsonl(os.path.join(data, "val.jsonl")); yv = np.array([r["label"] for r in val])
train = read_jsonl(os.path.join(data, "train.jsonl"))
enc_first = lambda texts: [window_ids(e.ids, "first") for e in tok.encode_batch(texts)]
val_ids = enc_first([r["text"] for r in val])
def softmax(z): z = z - z.max(1, keepdims=True); p = np.exp(z); return p / p.sum(1, keepdims=True)
def metrics(logits, y, t=1.0):
    p = softmax(logits / t)[:, 1]; pred = (p >= 0.5).astype(int)
    m = {"n": int(len(y)), "accuracy": round(float(accuracy_score(y, pred)), 4), "ece_15": round(ece_15(p, y), 4)}
    if 0 < y.sum() < len(y):
        m["f1"] = round(float(f1_score(y, pred)), 4); m["auroc"] = round(float(roc_auc_score(y, p)), 4)
    return m
def per_lang_metrics(logits, t):
    out = {}
    for lang in sorted({r["lang"] for r in val}):
        idx = [i for i, r in enumerate(val) if r["lang"] == lang]
        out[lang] = metrics(logits[idx], yv[idx], t)
    non = [i for i, r in enumerate(val) if r["lang"] != "en"]
    out["_non_en"] = metrics(logits[non], yv[non], t); out["_all"] = metrics(logits, yv, t)
    return out

class Sess:
    def __init__(self, path, threads=2):
        so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.inter_op_num_threads = 1
        self.s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    def run_ids(self, seqs):
        L = max(len(x) for x in seqs)
        a = np.full((len(seqs), L), PAD, np.int64); m = np.zeros((len(seqs), L), np.int64)
        for i, x in enumerate(seqs): a[i, :len(x)] = x; m[i, :len(x)] = 1
        return self.s.run(["logits", "embedding"], {"input_ids": a, "attention_mask": m})
    def served(self, seqs):
        L = np.zeros((len(seqs), 2), np.float32); E = np.zeros((len(seqs), 384), np.float32)
        for i, x in enumerate(seqs):
            l, e = self.run_ids([x]); L[i], E[i] = l[0], e[0]
        return L, E

# ---------- static INT8 candidates
class Reader(CalibrationDataReader):
    def __init__(self, ids): self.ids = ids; self.i = 0
    def get_next(self):
        if self.i >= len(self.ids): return None
        x = np.array([self.ids[self.i]], np.int64); self.i += 1
        return {"input_ids": x, "attention_mask": np.ones_like(x)}
uniq = sorted({(r["text"], r["window"]) for r in train})
calib_rows = random.Random(SEED).sample(uniq, min(300, len(uniq)))
calib_ids = [window_ids(tok.encode(t).ids, w) for t, w in calib_rows]
R["calibration_texts"] = {"n": len(calib_ids), "mean_tokens": round(float(np.mean([len(x) for x in calib_ids])), 1)}
g = onnx.load(pre)
EXCL = {"attention_mask_softmax": mask_path_nodes(g.graph),
        "layernorm": [n.name for n in g.graph.node if n.op_type == "LayerNormalization"]}
print("exclusion groups", {k: len(v) for k, v in EXCL.items()}, flush=True)
# Percentile calibration: feed flattened outputs in chunks (as finalize.py) - unpadded inputs of different lengths
from onnxruntime.quantization import calibrate as _cal
def _collect_chunked(self, data_reader):
    out_names = [o.name for o in self.infer_session.get_outputs()]; buf = []
    def flush():
        merged = {}
        for outs in buf:
            for k, v in zip(out_names, outs):
                if k in self.tensors_to_calibrate: merged.setdefault(k, []).append(np.asarray(v).ravel())
        if not self.collector:
            self.collector = _cal.HistogramCollector(method=self.method, symmetric=self.symmetric, num_bins=self.num_bins,
                                                     num_quantized_bins=self.num_quantized_bins, percentile=self.percentile,
                                                     scenario=self.scenario)
        self.collector.collect({k: np.concatenate(v) for k, v in merged.items()}); buf.clear()
    while True:
        inputs = data_reader.get_next()
        if not inputs: break
        buf.append([np.array(o, copy=True) for o in self.infer_session.run(None, inputs)])
        if len(buf) == 25: flush()
    if buf: flush()
    self.clear_collected_data()
_cal.HistogramCalibrater.collect_data = _collect_chunked

fpm = Sess(fp32); lv_fp32, _ = fpm.served(val_ids); fp32_val = metrics(lv_fp32, yv)
R["val_fp32"] = fp32_val; print("fp32 val", fp32_val, flush=True)
dynm = Sess(dyn); lv_dyn, _ = dynm.served(val_ids); R["val_dynamic_int8"] = metrics(lv_dyn, yv)
print("dynamic int8 val", R["val_dynamic_int8"], flush=True)
cands = []
def try_cand(act, method, groups=("attention_mask_softmax",)):
    nm = f"static_qdq_a-{act.name.lower()}_{method.name.lower()}_excl-" + "-".join(groups)
    path = os.path.join(work, nm + ".onnx"); ex = [n for gname in groups for n in EXCL[gname]]; t0 = time.time()
    quantize_static(pre, path, Reader(calib_ids), quant_format=QuantFormat.QDQ, per_channel=True, weight_type=QuantType.QInt8,
                    activation_type=act, calibrate_method=method, nodes_to_exclude=ex,
                    extra_options={} if method == CalibrationMethod.MinMax else {"CalibMaxIntermediateOutputs": 25})
    # (MinMax: no chunking - with 300 inputs and chunks of 25 onnxruntime 1.32 ends on an empty chunk: "No data is collected")
    lv, _ = Sess(path).served(val_ids); m = metrics(lv, yv)
    row = {"name": nm, "path": path, "activation": act.name, "calibration": method.name, "excluded_groups": list(groups),
           "n_excluded_nodes": len(ex), "quantise_s": round(time.time() - t0, 1), "val": m,
           "val_acc_drop_vs_fp32": round(fp32_val["accuracy"] - m["accuracy"], 4), "MB": round(os.path.getsize(path) / 1e6, 2)}
    print({k: v for k, v in row.items() if k != "path"}, flush=True); cands.append(row); return row
methods = [CalibrationMethod.MinMax] + ([CalibrationMethod.Percentile] if os.environ.get("CANDIDATES") == "all" else [])
# ACTIVATIONS=QUInt8 keeps the candidates to U8S8, the fast integer kernels on x86 without VNNI (see below).
acts = [QuantType[a] for a in os.environ.get("ACTIVATIONS", "QUInt8,QInt8").split(",")]
for act in acts:
    for method in methods:
        try: try_cand(act, method)
        except Exception as e:
            print("candidate failed", act, method, repr(e), flush=True); cands.append({"name": f"{act.name}_{method.name}", "error": repr(e)[:300]})
def time_1thread(path, runs=60):
    """Median ms of one 128-token window, 1 intra-op thread, after 10 warm-up runs."""
    so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
    se = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    x = {"input_ids": np.array([[BOS] + list(range(1000, 1126)) + [EOS]], np.int64), "attention_mask": np.ones((1, 128), np.int64)}
    t = []
    for r in range(runs + 10):
        t0 = time.perf_counter(); se.run(None, x)
        if r >= 10: t.append(time.perf_counter() - t0)
    return round(float(np.median(t)) * 1e3, 3)
TOL = 0.005
ok_c = lambda: [c for c in cands if "val" in c and c["val_acc_drop_vs_fp32"] <= TOL]
if not ok_c():
    # LayerNorms in float as well, for the best calibration of each activation type (the best overall alone would be
    # S8S8 whenever it leads by a hair, and S8S8 is several times slower here).
    for act in acts:
        best0 = max((c for c in cands if "val" in c and c["activation"] == act.name), key=lambda c: c["val"]["accuracy"], default=None)
        if best0:
            try_cand(act, CalibrationMethod[best0["calibration"]], ("attention_mask_softmax", "layernorm"))
valid = ok_c()
if not valid and os.environ.get("STATIC_ONLY") == "1":
    # The server batches (max_batch = 4) because a static model's scores do not move with batch-mates; dynamic INT8's
    # do (0.02-0.04 here). STATIC_ONLY=1 keeps the static candidates past TOL, and the card reports the drop.
    valid = [c for c in cands if "val" in c]
if valid:
    # Accuracy within TIE of the best counts as a tie, and the tie goes to the fastest (1 thread, one 128-token window):
    # on x86 without VNNI, ONNX Runtime runs S8S8 (QInt8 activation) MatMuls as float MatMuls with a per-call weight
    # dequantisation or as slow QLinearMatMul, U8S8 (QUInt8) as fast integer kernels (MLAS): same accuracy, 3x the cost.
    TIE = 0.002
    for c in valid:
        c["ms_1thread_128tok"] = time_1thread(c["path"])
    # Cost is a requirement, not a tie-break: a candidate over 1.5x the fastest one's window cost is out (round 14's
    # first build took an S8S8 graph at 27 ms a window against 3.9 ms for U8S8, for 0.08 points of accuracy).
    fastest = min(c["ms_1thread_128tok"] for c in valid)
    valid = [c for c in valid if c["ms_1thread_128tok"] <= 1.5 * fastest]
    top = max(c["val"]["accuracy"] for c in valid)
    tied = [c for c in valid if c["val"]["accuracy"] >= top - TIE]
    win = min(tied, key=lambda c: (c["ms_1thread_128tok"], -c["val"]["accuracy"])); shutil.copyfile(win["path"], final)
    R["quantisation"] = {"kind": "static", "format": "QDQ", "weights": "QInt8 per-channel", "activations": win["activation"],
                         "calibration_method": win["calibration"], "excluded_groups": win["excluded_groups"], "name": win["name"]}
else:
    shutil.copyfile(dyn, final)
    R["quantisation"] = {"kind": "dynamic", "weights": "QInt8 per-channel", "why": "no static QDQ setting within 0.5 % of FP32"}
R["quantisation_candidates"] = [{k: v for k, v in c.items() if k != "path"} for c in cands]
print("quantisation", R["quantisation"], flush=True)

# ---------- checks
s = ort.InferenceSession(final, providers=["CPUExecutionProvider"])
assert [i.name for i in s.get_inputs()] == ["input_ids", "attention_mask"]
assert [o.name for o in s.get_outputs()] == ["logits", "embedding"]
assert all(i.type == "tensor(int64)" for i in s.get_inputs()) and all(o.type == "tensor(float)" for o in s.get_outputs())
ids = np.array([[BOS, 100, 200, EOS], [BOS, 300, EOS, PAD]], np.int64); am = (np.arange(4)[None] < np.array([[4], [3]])).astype(np.int64)
l, e = s.run(None, {"input_ids": ids, "attention_mask": am})
assert l.shape == (2, 2) and e.shape == (2, 384) and np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-3)
with torch.no_grad():
    tl, _ = model(torch.tensor(ids), torch.tensor(am))
R["int8_vs_torch_logits_max_abs_diff"] = round(float(np.abs(l - tl.numpy()).max()), 4)
qnodes = onnx.load(final).graph.node
R["graph"] = {"QuantizeLinear": sum(n.op_type == "QuantizeLinear" for n in qnodes),
              "DequantizeLinear": sum(n.op_type == "DequantizeLinear" for n in qnodes),
              "embedding_gather_int8": any(n.op_type == "DequantizeLinear" and "word_embeddings" in n.input[0] for n in qnodes)}

# ---------- temperature (served mode, INT8)
m2 = Sess(final); lv, ev = m2.served(val_ids)
def nll(logt):
    z = lv / np.exp(logt); z = z - z.max(1, keepdims=True)
    return float(-(z[np.arange(len(yv)), yv] - np.log(np.exp(z).sum(1))).mean())
res = minimize_scalar(nll, bounds=(np.log(0.05), np.log(20)), method="bounded"); temp = float(np.exp(res.x))
R["temperature"] = temp; R["val_nll_before_after"] = [round(nll(0.0), 5), round(res.fun, 5)]
R["val_per_lang_before"] = per_lang_metrics(lv, 1.0); R["val_per_lang_after"] = per_lang_metrics(lv, temp)
R["val_fp32_per_lang"] = per_lang_metrics(lv_fp32, 1.0)
print("T", round(temp, 4), json.dumps(R["val_per_lang_after"]), flush=True)

# ---------- OOD score data (served mode, as finalize.py): 1 - max cosine to k-means centroids of the training
# embeddings; the score is the empirical CDF of that distance over the validation split (src/tier/model.rs reads it)
from sklearn.cluster import KMeans
train_ids = [window_ids(e.ids, r["window"]) for r, e in zip(train, tok.encode_batch([r["text"] for r in train]))]
_, etr = m2.served(train_ids)
C = KMeans(n_clusters=32, random_state=0, n_init=4).fit(etr).cluster_centers_
C = C / np.linalg.norm(C, axis=1, keepdims=True); C = np.round(C, 5); C = C / np.linalg.norm(C, axis=1, keepdims=True)
dist = lambda E: 1.0 - (E @ C.T).max(1)
qs = np.quantile(dist(ev), np.linspace(0, 1, 101))
R["ood"] = {"k": 32, "train_texts": len(train_ids), "val_distance_p50": round(float(np.median(dist(ev))), 4),
            "train_distance_p50": round(float(np.median(dist(etr))), 4)}
json.dump({"method": "1 - max cosine similarity to k-means centroids of training embeddings; score = empirical CDF over validation",
           "k": 32, "fitted_on": f"INT8 model embeddings (served mode: one text at a time, its training window of {MAX_LEN} tokens, "
                                 f"unpadded) of the training split ({len(train_ids)} texts, all languages); quantiles over the "
                                 f"validation split ({len(val)} texts)",
           "interpolation": "linear between the 101 quantiles; below the first -> 0, above the last -> 1",
           "centroids": [[round(float(v), 5) for v in c] for c in C], "quantiles": [round(float(v), 5) for v in qs]},
          open(os.path.join(out, "ood.json"), "w"))
print("ood", R["ood"], flush=True)

# ---------- batch invariance: 64 val texts (16 per token-length quartile), alone vs in padded batches of 8 (and 32)
pool = sorted(range(len(val)), key=lambda i: len(val_ids[i])); rnd = random.Random(SEED + 1); q = len(pool) // 4
pick = [i for k in range(4) for i in rnd.sample(pool[k * q:(k + 1) * q], min(16, q))]; rnd.shuffle(pick)
bi_ids = [val_ids[i] for i in pick]
def batch_invariance(m, t):
    alone = np.concatenate([m.run_ids([x])[0] for x in bi_ids]); p0 = softmax(alone / t)[:, 1]; o = {}
    for bs in (8, 32):
        lb = np.concatenate([m.run_ids(bi_ids[i:i + bs])[0] for i in range(0, len(bi_ids), bs)])
        o[f"batch_{bs}"] = float(np.abs(softmax(lb / t)[:, 1] - p0).max())
    o["max"] = max(o.values()); return o
R["batch_invariance"] = {"texts": len(bi_ids), "tokens_min_max": [min(map(len, bi_ids)), max(map(len, bi_ids))],
                         "metric": "max |p(risk) alone (batch 1, unpadded) - p(risk) in a padded batch|, calibrated",
                         "served_int8": batch_invariance(m2, temp), "fp32": batch_invariance(fpm, temp),
                         "dynamic_int8": batch_invariance(dynm, temp)}
print("batch invariance", R["batch_invariance"], flush=True)

# ---------- latency (1 thread, one 128-token window, median of 200) vs the served MiniLM INT8, same process, interleaved
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
def sess1(p):
    so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
    return ort.InferenceSession(p, so, providers=["CPUExecutionProvider"])
# The English MiniLM this model replaced: models/ before ml_build.sh installs, or BASELINE_ONNX (e.g. a copy from git
# history: git show 5b8e90b:models/risk-minilm-l6-int8.onnx > /tmp/minilm.onnx); without it the timing is skipped.
ref_path = os.environ.get("BASELINE_ONNX") or os.path.join(REPO, "models", "risk-minilm-l6-int8.onnx")
if not os.path.exists(ref_path):
    R["latency_1thread_128tok_ms"] = {"skipped": f"{ref_path} not found (set BASELINE_ONNX)"}
else:
  ref = sess1(ref_path); me = sess1(final)
  rng = np.random.default_rng(0)
  x_ml = np.array([[BOS] + rng.integers(4, cfg.vocab_size, 126).tolist() + [EOS]], np.int64)
  x_mini = np.array([[101] + rng.integers(1000, 30000, 126).tolist() + [102]], np.int64); one = np.ones((1, 128), np.int64)
  tr, tm = [], []
  import signal
  pause = int(os.environ["PAUSE_PID"]) if os.environ.get("PAUSE_PID") else None   # our own background training: stopped
  if pause: os.kill(pause, signal.SIGSTOP); time.sleep(2)                        # while timing, resumed right after
  try:
    for r in range(220):
      t0 = time.perf_counter(); ref.run(None, {"input_ids": x_mini, "attention_mask": one}); a = time.perf_counter() - t0
      t0 = time.perf_counter(); me.run(None, {"input_ids": x_ml, "attention_mask": one}); b = time.perf_counter() - t0
      if r >= 20: tr.append(a); tm.append(b)
  finally:
      if pause: os.kill(pause, signal.SIGCONT)
  R["latency_1thread_128tok_ms"] = {"student_int8": round(float(np.median(tm)) * 1e3, 3), "minilm_l6_int8": round(float(np.median(tr)) * 1e3, 3),
                                    "ratio": round(float(np.median(tm) / np.median(tr)), 3), "paused_pid": pause,
                                    "note": "indicative: the machine is shared (Rust builds); ml_cost.py's table is the reference"}
print("latency", R["latency_1thread_128tok_ms"], flush=True)

# ---------- artefacts (in OUT_DIR only)
sha = hashlib.sha256(open(final, "rb").read()).hexdigest()
R["files_MB"] = {"onnx": round(os.path.getsize(final) / 1e6, 2), "tokenizer_json": round(os.path.getsize(tok_json) / 1e6, 2)}
R["files_MB"]["total"] = round(sum(R["files_MB"].values()), 2)
json.dump({"name": NAME, "onnx": NAME + ".onnx", "sha256": sha, "tokenizer": "tokenizer.json", "max_seq_len": MAX_LEN,
           "labels": ["ok", "risk"], "inputs": ["input_ids", "attention_mask"], "outputs": ["logits", "embedding"], "embedding_dim": 384},
          open(os.path.join(out, "model.json"), "w"), indent=2)
json.dump({"temperature": round(temp, 5), "method": "temperature scaling (Guo et al. 2017), NLL on validation split",
           "fitted_on": f"INT8 model logits, served mode, validation split ({len(val)} texts, all languages)", "n": len(val),
           "ece_15_before": R["val_per_lang_before"]["_all"]["ece_15"], "ece_15_after": R["val_per_lang_after"]["_all"]["ece_15"]},
          open(os.path.join(out, "calibration.json"), "w"), indent=2)
R["sha256"] = sha; R["finalize_seconds"] = round(time.time() - t_start, 1)
for f in ("dedup.json", "data_stats.json"):
    p = os.path.join(data, f)
    if os.path.exists(p): R[f[:-5]] = json.load(open(p))
p = os.path.join(sckpt, "train_stats.json")
if os.path.exists(p): R["training"] = json.load(open(p))
json.dump(R, open(os.path.join(out, "metrics.json"), "w"), indent=1, ensure_ascii=False)
print("done", R["finalize_seconds"], R["files_MB"], flush=True)
