#!/usr/bin/env bash
# The multilingual recipe's three training steps (teacher, 2-layer student, kd) on one NVIDIA GPU, for a machine that
# has PyTorch, transformers and tokenizers but reaches no registry (models/recipe/README.md, "Training on a GPU").
# Usage: models/recipe/ml_gpu.sh IN_DIR OUT_DIR
#   IN_DIR  = pack/ (ml_gpu.py pack of the pruned base) + data/ (ml_prepare.py's train.jsonl, val.jsonl, each may be
#             gzipped: the working tree that travels to such a machine is limited)
#   OUT_DIR = logs, per-language validation JSON, and the trimmed students (ml_gpu.py trim: no word embeddings;
#             `ml_gpu.py merge` puts them back before ml_finalize.py)
# Knobs (env, the CPU recipe's names): REP_ML (2), EPOCHS (3), BS (32), STUDENT_LAYERS (2), S1_EPOCHS (2), S2_EPOCHS (1),
# KD_EPOCHS (3), AUG_COPIES (2), OK_WINDOWS (1: every window of a long ok text, since round 8). One H200: see models/recipe/README.md for the times.
set -euo pipefail
R="$(cd "$(dirname "$0")" && pwd)"
IN="$1"; OUT="$2"; W="${ML_GPU_WORK:-/tmp/ml_gpu}"
mkdir -p "$OUT" "$W"
export DEVICE="${DEVICE:-cuda}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONHASHSEED=0
export BS="${BS:-32}" STUDENT_LAYERS="${STUDENT_LAYERS:-2}"
L="$STUDENT_LAYERS"
log() { echo "[ml_gpu $(date +%T)] $*" | tee -a "$OUT/ml_gpu.log"; }
log "$(nvidia-smi -L 2>&1 | head -1); $(python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())')"
python3 "$R/ml_gpu.py" unpack "$IN/pack" "$W/base_pruned" | tee -a "$OUT/ml_gpu.log"
mkdir -p "$W/data"
for f in train val; do
    if [ -f "$IN/data/$f.jsonl.gz" ]; then gunzip -c "$IN/data/$f.jsonl.gz" > "$W/data/$f.jsonl"; else cp "$IN/data/$f.jsonl" "$W/data/"; fi
done
# progress lines every 100 steps only (the full log is in OUT)
quiet() { awk '!/ step [0-9]+\// || / step [0-9]*00\//' ; }

log "teacher (12 layers)"
REP_ML="${REP_ML:-2}" EPOCHS="${EPOCHS:-3}" python3 "$R/ml_train.py" teacher "$W/data" "$W/base_pruned" "$W/ckpt" \
    2>&1 | tee "$OUT/teacher.log" | quiet
cp "$W/ckpt/teacher/train_stats.json" "$OUT/teacher_stats.json"

log "student L$L (intermediate layers, then logits)"
REP_ML="${REP_ML:-2}" S1_EPOCHS="${S1_EPOCHS:-2}" S2_EPOCHS="${S2_EPOCHS:-1}" python3 "$R/ml_train.py" student "$W/data" "$W/base_pruned" "$W/ckpt" \
    2>&1 | tee "$OUT/student.log" | quiet
cp "$W/ckpt/student_L$L/train_stats.json" "$OUT/student_stats.json"
python3 "$R/ml_gpu.py" trim "$W/ckpt/student_L$L/model.pt" "$OUT/student_L$L.pt"

log "kd (teacher-scored augmented windows)"
OK_WINDOWS="${OK_WINDOWS:-1}" AUG_COPIES="${AUG_COPIES:-2}" KD_EPOCHS="${KD_EPOCHS:-3}" python3 "$R/ml_train.py" kd "$W/data" "$W/base_pruned" "$W/ckpt" \
    2>&1 | tee "$OUT/kd.log" | quiet
cp "$W/ckpt/student_L${L}_kd/train_stats.json" "$OUT/kd_stats.json"
python3 "$R/ml_gpu.py" trim "$W/ckpt/student_L${L}_kd/model.pt" "$OUT/student_L${L}_kd.pt"
log "done"
