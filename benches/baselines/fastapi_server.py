"""The baseline a user would write instead of tiergate: the same INT8 model served by Python.

FastAPI + uvicorn + onnxruntime + tokenizers, one ONNX Runtime session per uvicorn worker
process, the same model files as tiergate (models/): the same tokenizer truncated to
model.json's max_seq_len (128), the same calibration temperature (softmax(logits / T)), the
same out-of-distribution score (cosine to the ood.json centroids, empirical CDF over its
quantiles) and, like tiergate, the text cut to max_seq_len * 16 bytes before tokenising.
No batching: each request runs the model once, batch 1.

Inference runs on one dedicated thread per worker (a single-thread executor), so the event
loop stays free for HTTP while requests are serialised on the session, with no
oversubscription of the intra-op threads (FastAPI's default threadpool would run up to 40
`session.run` calls at once on 2 cores).

Run (from the repository root, after benches/baselines/setup.sh):

    BASELINE_INTRA_THREADS=2 benches/baselines/.venv/bin/uvicorn --app-dir benches/baselines \
        fastapi_server:app --host 127.0.0.1 --port 8000 --workers 1 --log-level warning

Environment: BASELINE_MODELS (default: models/ beside the repository root),
BASELINE_INTRA_THREADS (ONNX Runtime intra-op threads per worker, default 2),
BASELINE_SPINNING (0/1, default 0 as tiergate's intra_op_spinning = false).
"""

import asyncio
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI
from pydantic import BaseModel
from tokenizers import Tokenizer

MODELS = Path(os.environ.get("BASELINE_MODELS", Path(__file__).resolve().parents[2] / "models"))
INTRA_THREADS = int(os.environ.get("BASELINE_INTRA_THREADS", "2"))
SPINNING = os.environ.get("BASELINE_SPINNING", "0")

manifest = json.loads((MODELS / "model.json").read_text())
MAX_SEQ_LEN = manifest["max_seq_len"]
MAX_BYTES = MAX_SEQ_LEN * 16
TEMPERATURE = json.loads((MODELS / "calibration.json").read_text())["temperature"]
_ood = json.loads((MODELS / "ood.json").read_text())
CENTROIDS = np.asarray(_ood["centroids"], dtype=np.float32)  # [k, dim]
QUANTILES = np.asarray(_ood["quantiles"], dtype=np.float64)

tokenizer = Tokenizer.from_file(str(MODELS / manifest["tokenizer"]))
tokenizer.enable_truncation(max_length=MAX_SEQ_LEN)
tokenizer.no_padding()

options = ort.SessionOptions()
options.intra_op_num_threads = INTRA_THREADS
options.inter_op_num_threads = 1
options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
options.add_session_config_entry("session.intra_op.allow_spinning", SPINNING)
session = ort.InferenceSession(str(MODELS / manifest["onnx"]), options, providers=["CPUExecutionProvider"])
executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onnx")


def ood_score(embedding: np.ndarray) -> float:
    d = 1.0 - float(np.max(CENTROIDS @ embedding))
    n = len(QUANTILES)
    i = int(np.searchsorted(QUANTILES, d, side="right"))
    if i == 0:
        return 0.0
    if i == n:
        return 1.0
    lo, hi = QUANTILES[i - 1], QUANTILES[i]
    frac = (d - lo) / (hi - lo) if hi > lo else 0.0
    return ((i - 1) + frac) / (n - 1)


def infer(text: str) -> dict:
    text = text.encode("utf-8")[:MAX_BYTES].decode("utf-8", "ignore")
    enc = tokenizer.encode(text)
    ids = np.asarray([enc.ids], dtype=np.int64)
    mask = np.asarray([enc.attention_mask], dtype=np.int64)
    logits, embedding = session.run(["logits", "embedding"], {"input_ids": ids, "attention_mask": mask})
    z = logits[0].astype(np.float64) / TEMPERATURE
    p = np.exp(z - z.max())
    p /= p.sum()
    risk = float(p[1])
    return {
        "label": manifest["labels"][int(p.argmax())],
        "risk_score": risk,
        "confidence": float(p.max()),
        "ood_score": ood_score(embedding[0]),
        "tokens": len(enc.ids),
    }


class ClassifyRequest(BaseModel):
    text: str


app = FastAPI()


@app.post("/v1/classify")
async def classify(req: ClassifyRequest) -> dict:
    t = time.perf_counter()
    out = await asyncio.get_running_loop().run_in_executor(executor, infer, req.text)
    out["model"] = manifest["name"]
    out["latency_us"] = int((time.perf_counter() - t) * 1e6)
    return out


@app.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}
