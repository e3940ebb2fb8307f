"""Recover a trainable float student from a served static-QDQ INT8 model, for a data refresh without a teacher run.

Usage:
  ml_recover.py SERVED_MODELS_DIR BASE_DIR OUT_DIR [VAL_JSONL]
    SERVED_MODELS_DIR  models/ (model.json, the QDQ ONNX file, its pruned tokenizer.json)
    BASE_DIR           ml_base.py build output (the dequantised 250k-piece multilingual-e5-small)
    OUT_DIR            -> config.json + tokenizer.json (a BASE_DIR for ml_train.py / ml_finalize.py) and
                          student_L{n}/model.pt (INIT for `ml_train.py kd`)

Why: the served student's float checkpoint lives only in a training scratch directory; the ONNX file is what the
repository keeps. Every weight of it is stored as DequantizeLinear(q, scale, zero_point) of a constant, so
`(q - zero_point) * scale` gives it back up to its quantisation step (per output channel for the MatMul weights,
per tensor for biases, LayerNorms and position embeddings; a LayerNorm kept in float is its own initialiser). The
word-embedding matrix was frozen in training, so its exact float rows are taken from the base encoder through the
pruned tokenizer's pieces (and checked against the ONNX copy). Torch names follow the export: MatMul weights are
found through the MatMul node they feed
(`/encoder/encoder/layer.0/attention/self/query/MatMul` -> `encoder.encoder.layer.0.attention.self.query.weight`,
transposed back to torch's [out, in]); everything else carries its parameter name.

Checks: every parameter of the torch model is recovered (strict load); on VAL_JSONL (first 300 rows, first window)
the recovered float model and the served INT8 model agree on the label of >= 98 % and their p(risk) differ by a
reported median/max.
"""
import json, os, shutil, sys
import numpy as np, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ml_common import MLRiskClassifier, read_jsonl, tokenizer, window_ids, pad_batch, predict

served, base, out = sys.argv[1:4]
val = sys.argv[4] if len(sys.argv) > 4 else None
import onnx
from onnx import numpy_helper
from safetensors.numpy import load_file
from transformers import BertConfig

meta = json.load(open(os.path.join(served, "model.json")))
onnx_path = os.path.join(served, meta["onnx"])
g = onnx.load(onnx_path).graph
inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
consumers = {}
for n in g.node:
    for i in n.input:
        consumers.setdefault(i, []).append(n)


def dequantize(node):
    q = inits[node.input[0]].astype(np.float32)
    scale = inits[node.input[1]].astype(np.float32)
    zp = inits[node.input[2]].astype(np.float32) if len(node.input) > 2 else np.zeros_like(scale)
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    if scale.ndim == 1 and q.ndim > 1:                       # per-channel along `axis`
        shape = [1] * q.ndim; shape[axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return (q - zp) * scale


state = {}
for n in g.node:
    if n.op_type != "DequantizeLinear" or n.input[0] not in inits or not n.input[0].endswith("_quantized"):
        continue
    name = n.input[0][: -len("_quantized")]
    w = dequantize(n)
    if name.startswith("onnx::MatMul"):
        mm = next(c for c in consumers[n.output[0]] if c.op_type == "MatMul")
        name = mm.name.strip("/").replace("/", ".").removesuffix(".MatMul") + ".weight"
        w = w.T                                                # ONNX MatMul [in, out] -> torch Linear [out, in]
    elif not (name.startswith("encoder.") or name.startswith("head.")):
        continue                                               # graph constants (GELU's, the attention scale)
    state[name] = torch.from_numpy(np.ascontiguousarray(w))
# Parameters the quantiser left in float (LayerNorms when ml_finalize.py's LN-float candidate is served) are plain
# initialisers that carry their torch name.
for n in g.node:
    if n.op_type == "LayerNormalization":
        for name in n.input[1:]:
            if name in inits and name not in state:
                state[name] = torch.from_numpy(np.ascontiguousarray(inits[name].astype(np.float32)))

# Word embeddings: the base encoder's exact rows, by piece.
served_tok = json.load(open(os.path.join(served, meta["tokenizer"]), encoding="utf-8"))
base_tok = json.load(open(os.path.join(base, "tokenizer.json"), encoding="utf-8"))
base_ids = {p: i for i, (p, _) in enumerate(base_tok["model"]["vocab"])}
pieces = [p for p, _ in served_tok["model"]["vocab"]]
rows = [base_ids[p] for p in pieces]
bw = load_file(os.path.join(base, "model.safetensors"))
key = next(k for k in bw if k.endswith("word_embeddings.weight"))
word = torch.from_numpy(bw[key][rows].copy())
q_word = state["encoder.embeddings.word_embeddings.weight"]
step = float((q_word - word).abs().max())
print(f"word embeddings: {len(rows)} pieces from the base; max |ONNX INT8 - base| = {step:.5f}", flush=True)
state["encoder.embeddings.word_embeddings.weight"] = word

n_layers = 1 + max(int(k.split(".")[3]) for k in state if k.startswith("encoder.encoder.layer."))
cfg = BertConfig.from_pretrained(base); cfg.vocab_size = len(pieces); cfg.num_hidden_layers = n_layers
model = MLRiskClassifier(config=cfg)
missing = model.load_state_dict(state, strict=False)
buffers = {k for k, _ in model.named_buffers()}
left = [k for k in missing.missing_keys if k not in buffers]
if left or missing.unexpected_keys:
    sys.exit(f"not recovered: {left}; unexpected: {missing.unexpected_keys}")
os.makedirs(os.path.join(out, f"student_L{n_layers}"), exist_ok=True)
cfg.num_hidden_layers = 12          # a BASE_DIR's config: ml_train.py / ml_finalize.py set the student's depth
cfg.save_pretrained(out)
shutil.copy(os.path.join(served, meta["tokenizer"]), os.path.join(out, "tokenizer.json"))
torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, os.path.join(out, f"student_L{n_layers}", "model.pt"))
print(f"recovered {len(state)} tensors, {n_layers} layers, vocabulary {len(pieces)} -> {out}", flush=True)

if val:
    import onnxruntime as ort
    vrows = read_jsonl(val)[:300]
    tok = tokenizer(os.path.join(out, "tokenizer.json"))
    enc = [window_ids(e.ids, "first") for e in tok.encode_batch([r["text"] for r in vrows])]
    p_torch = predict(model, enc)
    sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    p_onnx = np.zeros(len(enc), np.float32)
    for i, e in enumerate(enc):
        ids, m = pad_batch([e])
        lg = sess.run(["logits"], {"input_ids": ids.numpy(), "attention_mask": m.numpy()})[0][0]
        p_onnx[i] = np.exp(lg[1]) / np.exp(lg).sum()
    d = np.abs(p_torch - p_onnx)
    agree = float(((p_torch >= 0.5) == (p_onnx >= 0.5)).mean())
    print(f"recovered float vs served INT8 on {len(enc)} rows: label agreement {agree:.4f}, "
          f"|p diff| median {np.median(d):.4f} max {d.max():.4f}", flush=True)
    if agree < 0.98:
        sys.exit("the recovered model does not reproduce the served one")
