"""Shared pieces of the multilingual recipe (ml_*.py): model, token windows, data, metrics.

Token ids follow the pruned XLM-R vocabulary written by `ml_base.py prune` (BASE_DIR = OUT/base_pruned): <s> = 0,
<pad> = 1, </s> = 2, <unk> = 3 (the specials keep their ids; the other pieces are renumbered in their old order).
"""
import json, os
from collections import defaultdict
import numpy as np
import torch, torch.nn as nn

MAX_LEN = 128      # [<s>] + 126 content tokens + [</s>]
STRIDE = 64
BOS, PAD, EOS = 0, 1, 2
HIDDEN = 384
# DEVICE=cuda trains on a GPU (the recipe's defaults are CPU); tensors are built on the CPU and moved here, and every
# checkpoint is saved with CPU tensors so that the other steps (finalize, eval) load it anywhere.
DEV = torch.device(os.environ.get("DEVICE", "cpu"))

def cpu_state(model):
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}

def load_state(path):
    return torch.load(path, weights_only=False, map_location="cpu")

def read_jsonl(p):
    return [json.loads(l) for l in open(p, encoding="utf-8") if l.strip()]

def tokenizer(path):
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(path)
    t.no_padding(); t.no_truncation()
    return t

def window_ids(ids, which, max_len=MAX_LEN):
    """ids = <s> c1..cn </s>; 'first' = <s> c1..c126 </s>; 'last' = <s> c(n-125)..cn </s>."""
    if len(ids) <= max_len:
        return list(ids)
    c, n = ids[1:-1], max_len - 2
    return [BOS] + (c[:n] if which == "first" else c[-n:]) + [EOS]

def served_windows(ids, max_len=MAX_LEN, overlap=32, most=8):
    """The windows the server reads of ids = <s> c1..cn </s> (config/tiergate.toml [model.windows]: overlap 32, max 8):
    content starts 0, stride, 2 * stride, ... (stride = max_len - 2 - overlap = 94), each <s> + 126 tokens + </s>, the
    last reaching the text's end unless `most` windows stop it first. A text of one window or less: [ids]."""
    c, n = ids[1:-1], max_len - 2
    stride = n - overlap
    return [[BOS] + c[o:o + n] + [EOS] for o in range(0, min(max(len(c) - overlap, 1), most * stride), stride)]

def pad_batch(seqs):
    L = max(len(x) for x in seqs)
    ids = torch.full((len(seqs), L), PAD, dtype=torch.long); m = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, x in enumerate(seqs):
        ids[i, :len(x)] = torch.tensor(x); m[i, :len(x)] = 1
    return ids, m

class MLRiskClassifier(nn.Module):
    """BERT encoder (multilingual-e5-small or a student cut from it) + mean pooling + linear 2-class head.
    forward -> (logits, L2-normalised mean-pooled embedding); with return_internals also the encoder outputs
    (hidden states incl. the embedding output, attention probabilities) for layer-to-layer distillation."""
    def __init__(self, encoder_dir=None, config=None, dropout=0.1, attn="sdpa"):
        super().__init__()
        from transformers import BertModel
        if encoder_dir is not None:
            self.encoder = BertModel.from_pretrained(encoder_dir, add_pooling_layer=False, attn_implementation=attn)
        else:
            self.encoder = BertModel(config, add_pooling_layer=False)
            self.encoder.config._attn_implementation = attn
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(self.encoder.config.hidden_size, 2)

    def forward(self, input_ids, attention_mask, return_internals=False):
        kw = {"output_hidden_states": True, "output_attentions": True} if return_internals else {}
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=torch.zeros_like(input_ids), **kw)
        h = out.last_hidden_state
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        logits = self.head(self.dropout(pooled))
        emb = pooled / pooled.norm(dim=-1, keepdim=True).clamp(min=1e-12)
        if return_internals:
            return logits, emb, out.hidden_states, out.attentions
        return logits, emb

def student_from_teacher(teacher, n_layers):
    """Student = the teacher's embeddings + n_layers of its layers (TinyBERT mapping g(m) = m * 12 / n: layer m of the
    student is initialised from teacher layer g(m) (1-based), i.e. every other / every third ... layer, ending with the
    last), + the teacher's head. Returns (student, mapping list of teacher hidden-state indices for m = 1..n)."""
    import copy
    NT = teacher.encoder.config.num_hidden_layers
    step = NT // n_layers
    mapping = [step * (m + 1) for m in range(n_layers)]          # hidden_states index (0 = embedding output)
    cfg = copy.deepcopy(teacher.encoder.config); cfg.num_hidden_layers = n_layers
    s = MLRiskClassifier(config=cfg, attn=teacher.encoder.config._attn_implementation)
    s.encoder.embeddings.load_state_dict(teacher.encoder.embeddings.state_dict())
    for m, g in enumerate(mapping):
        s.encoder.encoder.layer[m].load_state_dict(teacher.encoder.encoder.layer[g - 1].state_dict())
    s.head.load_state_dict(teacher.head.state_dict())
    return s, mapping

def ece_15(p1, y, n_bins=15):
    p1 = np.asarray(p1, np.float64); y = np.asarray(y)
    pred = (p1 >= 0.5).astype(int); conf = np.where(pred == 1, p1, 1 - p1); correct = (pred == y).astype(float)
    edges = np.linspace(0, 1, n_bins + 1); e = 0.0
    for i in range(n_bins):
        lo, hi = edges[i], edges[i + 1]
        sel = (conf > lo) & (conf <= hi) if i > 0 else (conf >= lo) & (conf <= hi)
        if sel.any(): e += sel.mean() * abs(correct[sel].mean() - conf[sel].mean())
    return float(e)

def per_lang(rows, p1):
    """accuracy per lang (p >= 0.5), plus overall; p1 = p(risk)."""
    d = defaultdict(lambda: [0, 0])
    for r, p in zip(rows, p1):
        d[r["lang"]][0] += 1; d[r["lang"]][1] += int((p >= 0.5) == bool(r["label"]))
    out = {k: {"n": v[0], "accuracy": round(v[1] / v[0], 4)} for k, v in sorted(d.items())}
    y = np.array([r["label"] for r in rows]); pr = np.asarray(p1)
    out["_all"] = {"n": len(rows), "accuracy": round(float(((pr >= 0.5) == y).mean()), 4)}
    non_en = [i for i, r in enumerate(rows) if r["lang"] != "en"]
    if non_en:
        out["_non_en"] = {"n": len(non_en), "accuracy": round(float(((pr[non_en] >= 0.5) == y[non_en]).mean()), 4)}
    return out

@torch.no_grad()
def predict(model, seqs, bs=32):
    model.eval()
    order = np.argsort([len(s) for s in seqs]); P = np.zeros(len(seqs), np.float32)
    for i in range(0, len(seqs), bs):
        idx = order[i:i + bs]
        ids, m = pad_batch([seqs[j] for j in idx])
        dev = next(model.parameters()).device
        lg, _ = model(ids.to(dev), m.to(dev))
        P[idx] = torch.softmax(lg.float(), -1)[:, 1].cpu().numpy()
    return P


# ---------------------------------------------------------------- ONNX helpers (ml_cost.py, ml_finalize.py)
def export_onnx(model, path):
    """input_ids, attention_mask (int64, [batch, sequence]) -> logits [batch, 2], embedding [batch, 384]; opset 17."""
    model.eval()
    ids = torch.tensor([[BOS, 100, 200, EOS], [BOS, 300, EOS, PAD]]); am = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    torch.onnx.export(model, (ids, am), path, dynamo=False, opset_version=17,
                      input_names=["input_ids", "attention_mask"], output_names=["logits", "embedding"],
                      dynamic_axes={"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
                                    "logits": {0: "batch"}, "embedding": {0: "batch"}})

def mask_path_nodes(graph):
    """Names of the nodes that must stay float for batch invariance: every node downstream of the attention_mask input
    up to and including the Adds that put the additive mask on the attention scores (the mask's Where/Sub/Mul that turn
    0/1 into 0/-inf, its Casts/Expands), the Softmaxes, and the pooling's mask multiply/sum/div. Calibration never sees
    padding, so a static scale on these tensors would clip the -inf of padded positions and padding would leak into real
    tokens (the old recipe measured a logit change of 1e-1)."""
    consumers = {}
    for n in graph.node:
        for i in n.input: consumers.setdefault(i, []).append(n)
    softmax_inputs = {n.input[0] for n in graph.node if n.op_type == "Softmax"}
    out, frontier, seen = set(), ["attention_mask"], set()
    while frontier:
        t = frontier.pop()
        for n in consumers.get(t, []):
            if n.name in seen: continue
            seen.add(n.name)
            if n.op_type == "Add" and any(o in softmax_inputs for o in n.output):
                out.add(n.name); continue                        # the scores + mask Add: stop here
            if n.op_type in ("MatMul", "Gemm"): continue          # never reached in practice
            out.add(n.name); frontier.extend(n.output)
    out |= {n.name for n in graph.node if n.op_type == "Softmax"}
    return sorted(out)
