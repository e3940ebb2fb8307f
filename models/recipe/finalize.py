"""Export -> INT8 -> choose max_seq_len -> temperature scaling -> OOD data -> metrics -> artefacts."""
import hashlib, json, os, random, shutil, sys, time
import numpy as np, torch
sys.path.insert(0, os.path.dirname(__file__))
from common import RiskClassifier, model_dir, read_jsonl, ece_15, OrtModel
from sklearn.metrics import roc_auc_score, f1_score, accuracy_score
from sklearn.cluster import KMeans
from scipy.optimize import minimize_scalar

data, ckpt, models, testdata = sys.argv[1:5]
work = os.path.join(ckpt, "onnx"); os.makedirs(work, exist_ok=True)
torch.set_num_threads(2)
NAME = "risk-minilm-l6-int8"
fp32 = os.path.join(work, "fp32.onnx"); pre = os.path.join(work, "fp32_pre.onnx")
int8 = os.path.join(models, NAME + ".onnx")
tok_json = os.path.join(models, "tokenizer.json")
# the packaged tokenizer.json pads every input to 128 (Fixed); ship it without padding (truncation at 128 kept)
_tj = json.load(open(os.path.join(model_dir(), "tokenizer.json"), encoding="utf-8"))
_tj["padding"] = None
json.dump(_tj, open(tok_json, "w", encoding="utf-8"), ensure_ascii=False)
R = {}

# ---------- export ----------
model = RiskClassifier(model_dir()); model.load_state_dict(torch.load(os.path.join(ckpt, "model.pt"))); model.eval()
ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]]); am = (ids != 0).long()
torch.onnx.export(model, (ids, am), fp32, dynamo=False, opset_version=17,
                  input_names=["input_ids", "attention_mask"], output_names=["logits", "embedding"],
                  dynamic_axes={"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
                                "logits": {0: "batch"}, "embedding": {0: "batch"}})
from onnxruntime.quantization import quantize_dynamic, QuantType
from onnxruntime.quantization.shape_inference import quant_pre_process
quant_pre_process(fp32, pre, skip_symbolic_shape=True)
quantize_dynamic(pre, int8, weight_type=QuantType.QInt8, per_channel=True)
print("int8 size MB", os.path.getsize(int8) / 1e6, flush=True)

# ---------- sanity check of the INT8 graph ----------
import onnxruntime as ort
s = ort.InferenceSession(int8, providers=["CPUExecutionProvider"])
assert [i.name for i in s.get_inputs()] == ["input_ids", "attention_mask"], s.get_inputs()
assert [o.name for o in s.get_outputs()] == ["logits", "embedding"]
assert all(i.type == "tensor(int64)" for i in s.get_inputs())
l, e = s.run(None, {"input_ids": ids.numpy(), "attention_mask": am.numpy()})
assert l.shape == (2, 2) and e.shape == (2, 384) and l.dtype == np.float32 and e.dtype == np.float32
with torch.no_grad():
    tl, te = model(ids, am)
print("int8 vs torch logits max abs diff", float(np.abs(l - tl.numpy()).max()), flush=True)

# ---------- data ----------
sa_val, sa_test = read_jsonl(f"{data}/sa_val.jsonl"), read_jsonl(f"{data}/sa_test.jsonl")
seed_val = read_jsonl(f"{data}/seed_val.jsonl")
SMOKE = os.environ.get("SMOKE")
if SMOKE:
    sa_val, sa_test, seed_val = sa_val[:40], sa_test[:40], seed_val[:20]
val = sa_val + seed_val
ood = read_jsonl(os.path.join(testdata, "ood_short.jsonl"))
T = lambda rows: [r["text"] for r in rows]; Y = lambda rows: np.array([r["label"] for r in rows])
def softmax(z): z = z - z.max(1, keepdims=True); p = np.exp(z); return p / p.sum(1, keepdims=True)
def metrics(logits, y, t=1.0):
    p = softmax(logits / t)[:, 1]; pred = (p >= 0.5).astype(int)
    return {"n": int(len(y)), "accuracy": round(float(accuracy_score(y, pred)), 4), "f1": round(float(f1_score(y, pred)), 4),
            "auroc": round(float(roc_auc_score(y, p)), 4), "ece_15": round(ece_15(p, y), 4)}

m2 = OrtModel(int8, threads=2, tokenizer_path=tok_json)
m1 = OrtModel(int8, threads=1, tokenizer_path=tok_json)
so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.add_session_config_entry("session.intra_op.allow_spinning", "0")
m2ns = OrtModel(int8, threads=2, tokenizer_path=tok_json); m2ns.sess = ort.InferenceSession(int8, so, providers=["CPUExecutionProvider"])

def latency(m, L, n=5 if SMOKE else 60):
    long_text = max(T(sa_val), key=len)
    a, msk = m.encode([long_text], L)
    assert a.shape[1] == L
    for _ in range(5): m.sess.run(None, {"input_ids": a, "attention_mask": msk})
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); m.sess.run(None, {"input_ids": a, "attention_mask": msk}); ts.append(time.perf_counter() - t0)
    return round(float(np.median(ts)) * 1000, 2)

# ---------- max_seq_len sweep on validation ----------
sweep = []
for L in (64, 128, 256):
    lv, _ = m2.run(T(val), max_len=L)
    row = {"max_seq_len": L, "val_sa": metrics(lv[:len(sa_val)], Y(sa_val)), "val_seed": metrics(lv[len(sa_val):], Y(seed_val)),
           "p50_ms_1thread": latency(m1, L), "p50_ms_2threads": latency(m2, L), "p50_ms_2threads_nospin": latency(m2ns, L)}
    print(row, flush=True); sweep.append(row)
R["max_seq_len_sweep"] = sweep
best = max(r["val_sa"]["accuracy"] for r in sweep)
# smallest length whose SA-val accuracy is within 0.25 pp of the best
chosen = min(r["max_seq_len"] for r in sweep if r["val_sa"]["accuracy"] >= best - 0.0025)
R["max_seq_len"] = chosen; print("chosen max_seq_len", chosen, flush=True)
R["latency_short_msg_p50_ms"] = {}
short = "Your package is held at customs, pay the fee here"
for nm, m in (("1thread", m1), ("2threads", m2), ("2threads_nospin", m2ns)):
    a, msk = m.encode([short], chosen)
    for _ in range(5): m.sess.run(None, {"input_ids": a, "attention_mask": msk})
    ts = []
    for _ in range(100):
        t0 = time.perf_counter(); m.sess.run(None, {"input_ids": a, "attention_mask": msk}); ts.append(time.perf_counter() - t0)
    R["latency_short_msg_p50_ms"][nm] = round(float(np.median(ts)) * 1000, 2)
R["latency_short_msg_tokens"] = int(a.shape[1])

# ---------- temperature scaling on validation (INT8 logits) ----------
lv, ev = m2.run(T(val), max_len=chosen); yv = Y(val)
def nll(logt):
    z = lv / np.exp(logt); z = z - z.max(1, keepdims=True)
    return float(-(z[np.arange(len(yv)), yv] - np.log(np.exp(z).sum(1))).mean())
res = minimize_scalar(nll, bounds=(np.log(0.05), np.log(20)), method="bounded")
temp = float(np.exp(res.x)); print("T", temp, flush=True)
R["temperature"] = temp
R["val_nll_before_after"] = [round(nll(0.0), 5), round(res.fun, 5)]

# ---------- test + OOD-set metrics ----------
lt, et = m2.run(T(sa_test), max_len=chosen); yt = Y(sa_test)
R["test_int8_before"] = metrics(lt, yt); R["test_int8_after"] = metrics(lt, yt, temp)
lo, eo = m2.run(T(ood), max_len=chosen); yo = Y(ood)
R["ood_set_before"] = metrics(lo, yo); R["ood_set_after"] = metrics(lo, yo, temp)
po = softmax(lo / temp)[:, 1]; pt = softmax(lt / temp)[:, 1]
R["ood_set_false_blocks_at_0.8"] = int(((po >= 0.8) & (yo == 0)).sum())
R["ood_set_missed_risk_below_0.5"] = int(((po < 0.5) & (yo == 1)).sum())
R["test_false_blocks_at_0.8"] = int(((pt >= 0.8) & (yt == 0)).sum())
R["ood_set_errors"] = [{"text": ood[i]["text"], "label": int(yo[i]), "p_risk": round(float(po[i]), 3)}
                       for i in range(len(ood)) if (po[i] >= 0.5) != bool(yo[i])]
# fp32 reference on test
fpm = OrtModel(fp32, threads=2, tokenizer_path=tok_json)
lf, _ = fpm.run(T(sa_test), max_len=chosen); R["test_fp32_before"] = metrics(lf, yt)
lfo, _ = fpm.run(T(ood), max_len=chosen); R["ood_set_fp32_before"] = metrics(lfo, yo)
print(json.dumps({k: R[k] for k in R if k.startswith(("test", "ood_set_b", "ood_set_a", "ood_set_f"))}, indent=1), flush=True)

# ---------- OOD score data ----------
train_rows = read_jsonl(f"{data}/sa_train.jsonl") + read_jsonl(f"{data}/passages_train.jsonl") + read_jsonl(f"{data}/seed_train.jsonl")
if SMOKE: train_rows = train_rows[:100]
_, etr = m2.run(T(train_rows), max_len=chosen)
km = KMeans(n_clusters=32, random_state=0, n_init=4).fit(etr)
C = km.cluster_centers_; C = C / np.linalg.norm(C, axis=1, keepdims=True)
C = np.round(C, 5); C = C / np.linalg.norm(C, axis=1, keepdims=True)  # what ood.json stores (renormalised after rounding)
dist = lambda E: 1.0 - (E @ C.T).max(1)
qs = np.quantile(dist(ev), np.linspace(0, 1, 101))
def score(d): return np.searchsorted(np.sort(dist(ev)), d, side="right") / len(ev)
def cdf_from_q(d):  # run-time definition: empirical CDF interpolated over the stored quantiles
    return np.interp(d, qs, np.linspace(0, 1, 101), left=0.0, right=1.0)
def summ(x): return {"mean": round(float(np.mean(x)), 3), "p10": round(float(np.quantile(x, .1)), 3), "p50": round(float(np.median(x)), 3),
                     "p90": round(float(np.quantile(x, .9)), 3), "frac_ge_0.9": round(float((x >= 0.9).mean()), 3), "frac_ge_0.99": round(float((x >= 0.99).mean()), 3)}
R["ood_score_test"] = summ(cdf_from_q(dist(et))); R["ood_score_ood_set"] = summ(cdf_from_q(dist(eo)))
R["ood_distance_test_p50"] = round(float(np.median(dist(et))), 4); R["ood_distance_ood_set_p50"] = round(float(np.median(dist(eo))), 4)
R["ood_n_train_embeddings"] = len(train_rows)
print("ood test", R["ood_score_test"], "ood set", R["ood_score_ood_set"], flush=True)
json.dump({"method": "1 - max cosine similarity to k-means centroids of training embeddings; score = empirical CDF over validation",
           "k": 32, "fitted_on": f"INT8 model embeddings of the training set ({len(train_rows)} texts: SpamAssassin train split + passages + seed train); quantiles over the validation split ({len(val)} texts)",
           "interpolation": "linear between the 101 quantiles; below the first -> 0, above the last -> 1",
           "centroids": [[round(float(v), 5) for v in c] for c in C], "quantiles": [round(float(v), 5) for v in qs]},
          open(os.path.join(models, "ood.json"), "w"))

# ---------- artefacts ----------
sha = hashlib.sha256(open(int8, "rb").read()).hexdigest()
json.dump({"name": NAME, "onnx": NAME + ".onnx", "sha256": sha, "tokenizer": "tokenizer.json", "max_seq_len": chosen,
           "labels": ["ok", "risk"], "inputs": ["input_ids", "attention_mask"], "outputs": ["logits", "embedding"], "embedding_dim": 384},
          open(os.path.join(models, "model.json"), "w"), indent=2)
json.dump({"temperature": round(temp, 5), "method": "temperature scaling (Guo et al. 2017), NLL on validation split",
           "fitted_on": f"INT8 model logits at max_seq_len {chosen} on the validation split: SpamAssassin val ({len(sa_val)}) + seed-set val ({len(seed_val)})",
           "n": len(val), "ece_15_before": R["test_int8_before"]["ece_15"], "ece_15_after": R["test_int8_after"]["ece_15"],
           "ece_evaluated_on": f"SpamAssassin test split ({len(sa_test)} messages), INT8 model"},
          open(os.path.join(models, "calibration.json"), "w"), indent=2)
R["sha256"] = sha; R["onnx_bytes"] = os.path.getsize(int8)
json.dump(R, open(os.path.join(models, "recipe", "metrics.json"), "w"), indent=1)

def trunc(t, n=4000):
    b = t.encode("utf-8")[:n]; return b.decode("utf-8", errors="ignore")
rnd = random.Random(7)
for name, rows, k in (() if SMOKE else (("test_sample.jsonl", sa_test, 200), ("val_sample.jsonl", sa_val, 300))):
    smp = rnd.sample(rows, k)
    with open(os.path.join(testdata, name), "w") as fh:
        for r in smp: fh.write(json.dumps({"text": trunc(r["text"]), "label": r["label"]}, ensure_ascii=False) + "\n")
print("done", flush=True)
