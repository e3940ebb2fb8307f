"""Cost of candidate students vs the served MiniLM-L6 INT8 (one 128-token window, batch 1, 1 intra-op thread).

Usage: ml_cost.py BASE_DIR OUT_DIR [PAUSE_PID]
  BASE_DIR = ml_base.py prune output (pruned vocabulary). Students = the first n layers' shape (weights from the base's
  layers g(m) = m*12/n; weights do not change the cost), hidden 384, the pruned vocabulary; n in LAYERS (2,3,4,6), plus
  the 12-layer teacher for reference. Each is exported (opset 17), pre-processed, and quantised: dynamic INT8
  (per-channel) and static QDQ INT8 (per-channel weights, QUInt8 activations, MinMax on 32 random windows; mask path +
  Softmax kept in float, as ml_finalize.py does). Timing: models/risk-minilm-l6-int8.onnx and every candidate in ONE
  process, interleaved (each round runs every model once, in a shuffled order), 200 rounds after 20 warm-up rounds,
  median per model; ratio = median / median(MiniLM). PAUSE_PID: a process (our own background training) stopped
  with SIGSTOP while timing and resumed after, so the two cores are quiet.
"""
import json, os, random, signal, sys, time
import numpy as np, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ml_common import MLRiskClassifier, student_from_teacher, export_onnx, mask_path_nodes, BOS, EOS

base, out = sys.argv[1], sys.argv[2]
pause = int(sys.argv[3]) if len(sys.argv) > 3 else None
os.makedirs(out, exist_ok=True)
torch.set_num_threads(2)
LAYERS = [int(x) for x in os.environ.get("LAYERS", "2,3,4,6").split(",")]
ROUNDS = int(os.environ.get("ROUNDS", 200))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import onnx, onnxruntime as ort
from onnxruntime.quantization import (quantize_dynamic, quantize_static, QuantType, QuantFormat, CalibrationMethod,
                                      CalibrationDataReader)
from onnxruntime.quantization.shape_inference import quant_pre_process

teacher = MLRiskClassifier(base, attn="eager"); teacher.eval()
V = teacher.encoder.config.vocab_size
rng = np.random.default_rng(0)
class Reader(CalibrationDataReader):
    def __init__(self):
        self.x = [np.array([[BOS] + rng.integers(4, V, int(L)).tolist() + [EOS]], np.int64) for L in rng.integers(10, 126, 32)]
        self.i = 0
    def get_next(self):
        if self.i >= len(self.x): return None
        x = self.x[self.i]; self.i += 1
        return {"input_ids": x, "attention_mask": np.ones_like(x)}

R = {"models": {}}
cands = {}
TIME_ONLY = os.environ.get("TIME_ONLY")      # re-time the files of an earlier run (cost.json's models kept)
if TIME_ONLY:
    R["models"] = json.load(open(os.path.join(out, "cost.json")))["models"]
    for n in LAYERS + [12]:
        for v in ("fp32", "dynamic_int8", "static_qdq"):
            cands[f"L{n}_{v}"] = os.path.join(out, f"L{n}_{v}.onnx")
for n in ([] if TIME_ONLY else LAYERS + [12]):
    t0 = time.time()
    if n == 12:
        model = teacher
    else:
        model, mapping = student_from_teacher(teacher, n)
    tag = f"L{n}"
    fp32 = os.path.join(out, f"{tag}_fp32.onnx"); pre = os.path.join(out, f"{tag}_pre.onnx")
    export_onnx(model, fp32)
    quant_pre_process(fp32, pre, skip_symbolic_shape=True)
    dyn = os.path.join(out, f"{tag}_dynamic_int8.onnx")
    quantize_dynamic(pre, dyn, weight_type=QuantType.QInt8, per_channel=True)
    g = onnx.load(pre); excl = mask_path_nodes(g.graph)
    qdq = os.path.join(out, f"{tag}_static_qdq.onnx")
    quantize_static(pre, qdq, Reader(), quant_format=QuantFormat.QDQ, per_channel=True, weight_type=QuantType.QInt8,
                    activation_type=QuantType.QUInt8, calibrate_method=CalibrationMethod.MinMax, nodes_to_exclude=excl)
    mb = lambda p: round(os.path.getsize(p) / 1e6, 1)
    R["models"][tag] = {"layers": n, "params_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
                        "MB_fp32": mb(fp32), "MB_dynamic_int8": mb(dyn), "MB_static_qdq": mb(qdq),
                        "float_kept_nodes": len(excl), "build_s": round(time.time() - t0, 1)}
    cands[f"{tag}_fp32"] = fp32; cands[f"{tag}_dynamic_int8"] = dyn; cands[f"{tag}_static_qdq"] = qdq
    print(tag, R["models"][tag], flush=True)
cands = {k: v for k, v in cands.items() if not (k.startswith("L12") and k.endswith("fp32"))}

# ---- timing: one 128-token window, batch 1, 1 thread
def sess(p):
    so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(p, so, providers=["CPUExecutionProvider"])
ref = os.path.join(REPO, "models", "risk-minilm-l6-int8.onnx")
S = {"minilm_l6_int8 (served)": sess(ref)}
for k, p in cands.items(): S[k] = sess(p)
x_ml = np.array([[BOS] + rng.integers(4, V, 126).tolist() + [EOS]], np.int64)
x_mini = np.array([[101] + rng.integers(1000, 30000, 126).tolist() + [102]], np.int64)
feeds = {k: {"input_ids": (x_mini if k.startswith("minilm") else x_ml), "attention_mask": np.ones((1, 128), np.int64)} for k in S}
if pause: os.kill(pause, signal.SIGSTOP); time.sleep(2)
try:
    order = list(S); times = {k: [] for k in S}; rr = random.Random(0)
    for r in range(20 + ROUNDS):
        rr.shuffle(order)
        for k in order:
            t0 = time.perf_counter(); S[k].run(None, feeds[k]); dt = time.perf_counter() - t0
            if r >= 20: times[k].append(dt)
finally:
    if pause: os.kill(pause, signal.SIGCONT)
base_ms = float(np.median(times["minilm_l6_int8 (served)"])) * 1e3
R["timing"] = {k: {"median_ms": round(float(np.median(v)) * 1e3, 3), "p90_ms": round(float(np.quantile(v, .9)) * 1e3, 3),
                   "ratio_vs_minilm": round(float(np.median(v)) * 1e3 / base_ms, 3)} for k, v in times.items()}
R["setup"] = {"load_avg_1min_at_end": os.getloadavg()[0], "window_tokens": 128, "batch": 1, "intra_op_threads": 1, "rounds": ROUNDS, "warmup_rounds": 20,
              "onnxruntime": ort.__version__, "vocab": V, "paused_pid": pause}
json.dump(R, open(os.path.join(out, "cost_retime.json" if TIME_ONLY else "cost.json"), "w"), indent=1)
print(f"{'model':34s} {'median ms':>10s} {'ratio':>7s}")
for k, v in sorted(R["timing"].items(), key=lambda kv: kv[1]["median_ms"]):
    print(f"{k:34s} {v['median_ms']:10.3f} {v['ratio_vs_minilm']:7.3f}")
