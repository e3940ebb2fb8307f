#!/usr/bin/env bash
# Rebuild the training/validation split that every refresh since round 5 kept (ml_refresh_split.py: a validation row
# stays in validation), from the repository's history alone, for a machine whose scratch directory is gone: each
# round's ml_prepare.py run is replayed from `git archive` of the commit that had its data (that commit's recipe, data
# and check sets), chained through ml_refresh_split.py. Reproduces the recorded counts within two rows (round 14:
# 31,985 / 3,811 against 31,987 / 3,809); 9.5 min on 2 cores for rounds 5-14, 19 min through round 22 (the served
# encoder's split: 42,611 / 4,407, exactly as recorded).
# Usage: models/recipe/ml_history_split.sh [SCRATCH_DIR] [CHAIN_DIR]   (defaults /work/scratch/ml, /work/scratch/chain)
# Needs SCRATCH_DIR/venv, SCRATCH_DIR/base and SCRATCH_DIR/sa_data (ml_build.sh steps 1-3). Output: CHAIN_DIR/d14
# and CHAIN_DIR/d22 (train.jsonl, val.jsonl): the OLD_DATA of the next `ml_refresh_split.py CHAIN_DIR/d22 NEW_DATA
# OUT ml_r1,ml_r2 3`.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
S="${1:-/work/scratch/ml}"; C="${2:-/work/scratch/chain}"
PY="$S/venv/bin/python"
export PYTHONHASHSEED=0 TOKENIZERS_PARALLELISM=false SA_DIR="$S/sa_data"
# round, commit whose tree the round's ml_prepare.py ran on, prefix of the rows written three times (as recorded in
# models/recipe/README.md, rounds 6-22; rounds 16, 17, 20, 23 and 24 added no rows to the served encoder's split)
ROUNDS=("5 08f1198 -" "6 c603397 ml_r6" "7 94f0140 ml_r7" "8 bbe5420 ml_r8" "9 b86449b ml_r9" "10 410f959 ml_r10"
        "11 e76597d ml_r1" "12 e76597d ml_r1" "13 a91ee31 ml_r1" "14 d71eeff ml_r1"
        "15 c8acd34 ml_r1" "18 9c3450b ml_r1" "19 f240335 ml_r1" "21 246e5de ml_r1,ml_r2" "22 ad485e6 ml_r1,ml_r2")
prev=""
for r in "${ROUNDS[@]}"; do
  set -- $r
  if [ ! -f "$C/d$1/val.jsonl" ]; then
    echo "[ml_history_split $(date +%T)] round $1 ($2)" >&2
    rm -rf "$C/r$1"; mkdir -p "$C/r$1"
    git -C "$REPO" archive "$2" models/recipe tests/data | tar -x -C "$C/r$1"
    # round 11 was prepared before round 12's rows were written (both landed in one commit)
    [ "$1" = 11 ] && rm -f "$C/r11/models/recipe/data/"ml_r12_*
    if [ -z "$prev" ]; then
      "$PY" "$C/r$1/models/recipe/ml_prepare.py" "$C/d$1" "$S/base/tokenizer.json" > "$C/prep$1.log" 2>&1
    else
      "$PY" "$C/r$1/models/recipe/ml_prepare.py" "$C/new$1" "$S/base/tokenizer.json" > "$C/prep$1.log" 2>&1
      "$PY" "$REPO/models/recipe/ml_refresh_split.py" "$C/$prev" "$C/new$1" "$C/d$1" "$3" 3
    fi
  fi
  prev="d$1"
done
wc -l "$C/d14/train.jsonl" "$C/d14/val.jsonl" "$C/d22/train.jsonl" "$C/d22/val.jsonl"
