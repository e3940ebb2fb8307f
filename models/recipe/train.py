import math, os, random, sys, time
import numpy as np, torch
sys.path.insert(0, os.path.dirname(__file__))
from common import RiskClassifier, model_dir, read_jsonl, tokenizer, window_ids

data, ckpt = sys.argv[1], sys.argv[2]
MAX_LEN = int(os.environ.get("MAX_LEN", 128)); EPOCHS = float(os.environ.get("EPOCHS", 1.6))
BS = 16; LR = 5e-5; SEED = 1234
torch.manual_seed(SEED); random.seed(SEED); np.random.seed(SEED)
torch.set_num_threads(int(os.environ.get("THREADS", 2)))
tok = tokenizer()
model = RiskClassifier(model_dir())
rows = read_jsonl(os.path.join(data, "train_mix.jsonl"))
# token windows (prepare_data.py decided which window of a long text each example is); trained on token ids directly
enc = [window_ids(e.ids, r.get("window", "first"), MAX_LEN) for r, e in zip(rows, tok.encode_batch([r["text"] for r in rows]))]
labels = [r["label"] for r in rows]
print("train examples", len(rows), "mean tokens", np.mean([len(x) for x in enc]), flush=True)

def batches(epoch):
    # length-bucketed shuffled batches (less padding -> faster on CPU)
    rnd = random.Random(SEED + epoch)
    idx = list(range(len(enc))); rnd.shuffle(idx)
    chunks = [sorted(idx[i:i + BS * 50], key=lambda j: len(enc[j])) for i in range(0, len(idx), BS * 50)]
    bl = [c[i:i + BS] for c in chunks for i in range(0, len(c), BS)]
    rnd.shuffle(bl); return bl

steps_per_epoch = math.ceil(len(enc) / BS); total = int(steps_per_epoch * EPOCHS)
no_decay = ["bias", "LayerNorm.weight"]
params = [{"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)], "weight_decay": 0.01},
          {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0}]
opt = torch.optim.AdamW(params, lr=LR)
warm = int(0.06 * total)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / max(1, warm), max(0.0, (total - s) / max(1, total - warm))))
lossf = torch.nn.CrossEntropyLoss()
model.train(); step = 0; t0 = time.time(); run = 0.0; seen = 0
ep = 0
# resumable: state every 100 steps (the machine is shared; a killed run continues where it stopped, same result)
import hashlib
os.makedirs(ckpt, exist_ok=True)
RESUME = os.path.join(ckpt, "resume.pt")
fp = hashlib.sha1(open(os.path.join(data, "train_mix.jsonl"), "rb").read() + f"{EPOCHS} {MAX_LEN} {BS} {LR} {SEED}".encode()).hexdigest()
skip = 0; prev_el = 0.0
if os.path.exists(RESUME):
    st = torch.load(RESUME, weights_only=False)
    if st["fp"] == fp:
        model.load_state_dict(st["model"]); opt.load_state_dict(st["opt"]); sched.load_state_dict(st["sched"])
        step, ep, skip, run, seen, prev_el = st["step"], st["ep"], st["pos"], st["run"], st["seen"], st["elapsed"]
        torch.set_rng_state(st["rng"]); print(f"resumed at step {step} (epoch {ep}, batch {skip})", flush=True)
t0 -= prev_el
while step < total:
    for bi_, b in enumerate(batches(ep)):
        if bi_ < skip: continue
        if step >= total: break
        L = max(len(enc[j]) for j in b)
        ids = torch.zeros((len(b), L), dtype=torch.long); m = torch.zeros_like(ids)
        for i, j in enumerate(b):
            ids[i, :len(enc[j])] = torch.tensor(enc[j]); m[i, :len(enc[j])] = 1
        y = torch.tensor([labels[j] for j in b])
        logits, _ = model(ids, m)
        loss = lossf(logits, y)
        opt.zero_grad(); loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(); sched.step(); step += 1; seen += len(b)
        run = 0.98 * run + 0.02 * loss.item() if step > 1 else loss.item()
        if step % 50 == 0:
            el = time.time() - t0
            print(f"step {step}/{total} ep {ep} loss {run:.4f} {seen/el:.1f} seq/s elapsed {el:.0f}s", flush=True)
        if step % 100 == 0 and step < total:
            torch.save({"fp": fp, "model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(), "step": step,
                        "ep": ep, "pos": bi_ + 1, "run": run, "seen": seen, "elapsed": time.time() - t0,
                        "rng": torch.get_rng_state()}, RESUME + ".tmp")
            os.replace(RESUME + ".tmp", RESUME)
    ep += 1; skip = 0
model.eval()
torch.save(model.state_dict(), os.path.join(ckpt, "model.pt"))
if os.path.exists(RESUME): os.remove(RESUME)
print("done", time.time() - t0, flush=True)
import json
json.dump({"train_seconds": round(time.time() - t0, 1), "examples": len(rows), "epochs": EPOCHS, "steps": total,
           "mean_tokens": round(float(np.mean([len(x) for x in enc])), 1), "threads": torch.get_num_threads()},
          open(os.path.join(ckpt, "train_stats.json"), "w"), indent=1)
