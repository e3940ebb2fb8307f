#!/usr/bin/env bash
# The lexical model (ml_lexical.py) for a data split, and its combination with the encoder of a model directory:
# train on DATA_DIR/train.jsonl, then fit the combination on the encoder's own scores of DATA_DIR/val.jsonl, which
# that encoder gives through `tiergate serve` (the riskiest of the served windows, exactly as served; a copy of the
# encoder's files without "lexical" in model.json, so an installed lexical model does not score itself).
# Usage: models/recipe/ml_lexical_build.sh DATA_DIR MODELS_DIR OUT_DIR   (OUT_DIR: lexical.json + lexical.bin)
# Needs PY (the recipe's venv python; default python3) and the tiergate binary (TIERGATE_BIN, default
# target/release/tiergate); serves on 127.0.0.1:18599 (PORT). ~3 min on 2 cores for 50,000 training rows.
# Installing the result into a model directory (and its MANIFEST.sha256) is the caller's step (ml_build.sh step 8).
set -euo pipefail
RECIPE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(dirname "$(dirname "$RECIPE")")"
DATA="$1"; MODELS="$2"; L="$3"
PY="${PY:-python3}"; PORT="${PORT:-18599}"
mkdir -p "$L"
"$PY" "$RECIPE/ml_lexical.py" train "$DATA" "$L"
"$PY" "$RECIPE/ml_lexical.py" valset "$DATA" "$L/val.jsonl"

E="$L/encoder"; rm -rf "$E"; mkdir -p "$E"
ONNX="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["onnx"])' "$MODELS/model.json")"
cp "$MODELS/$ONNX" "$MODELS/tokenizer.json" "$MODELS/calibration.json" "$MODELS/ood.json" "$E/"
"$PY" -c 'import json,sys; m=json.load(open(sys.argv[1])); m.pop("lexical",None); json.dump(m,open(sys.argv[2],"w"),indent=2)' \
  "$MODELS/model.json" "$E/model.json"
(cd "$E" && sha256sum model.json "$ONNX" tokenizer.json calibration.json ood.json > MANIFEST.sha256)

printf '[server]\nlisten = "127.0.0.1:%s"\n[admin]\nlisten = "127.0.0.1:%s"\n[model]\ndir = "%s"\n[policies]\ndir = "%s"\n' \
  "$PORT" "$((PORT + 1))" "$E" "$REPO/policies" > "$L/serve.toml"
"${TIERGATE_BIN:-$REPO/target/release/tiergate}" serve --config "$L/serve.toml" > "$L/serve.log" 2>&1 & SERVE=$!
trap 'kill $SERVE 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null && break; sleep 1; done
python3 "$RECIPE/blind_report.py" "$L/val.jsonl" --url "http://127.0.0.1:$PORT/v1/classify" --out "$L/val.json" \
  --decisions "$L/val.dec.jsonl" > "$L/val.log"
kill $SERVE; trap - EXIT
"$PY" "$RECIPE/ml_lexical.py" combine "$L" "$L/val.jsonl:$L/val.dec.jsonl"
rm -rf "$E"
