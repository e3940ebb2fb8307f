#!/usr/bin/env bash
# Two models (each with its policy and [model] batching settings) side by side in one run, alternating, a fresh
# `tiergate serve` for every measurement: long texts (tests/data/test_sample.jsonl >= 1,501 bytes, read whole) at
# 10/s for 15 s, then short messages (tests/data/ood_short.jsonl <= 200 bytes) at rising rates until one saturates.
# Usage: benches/model_ab.sh A_MODELS A_POLICIES A_MAX_BATCH A_PARALLEL  B_MODELS B_POLICIES B_MAX_BATCH B_PARALLEL
#   e.g. the English model of 0c574e8 (git archive 0c574e8 models policies | tar -x -C /tmp/old) against the shipped one:
#   benches/model_ab.sh /tmp/old/models /tmp/old/policies 1 false models policies 4 true
# Knobs (env): AB_REPEAT (2), AB_RATES (200,400,600,800,1000). Output: target/model_ab/report.jsonl (openloop's JSON).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"; cd "$ROOT"
[ $# -eq 8 ] || { sed -n 2,8p "$0" >&2; exit 2; }
. benches/lib.sh
OL="$(benches/bench_bin.sh openloop)"; cargo build --release -q
OUT=target/model_ab; mkdir -p "$OUT"; : > "$OUT/report.jsonl"; PORT=${PORT:-18700}
for rep in $(seq 1 "${AB_REPEAT:-2}"); do
  for side in A B; do
    if [ $side = A ]; then M=$1 P=$2 MB=$3 PAR=$4; else M=$5 P=$6 MB=$7 PAR=$8; fi
    sed -e "s#^dir = \"../models\"#dir = \"$(realpath "$M")\"#" -e "s#^dir = \"../policies\"#dir = \"$(realpath "$P")\"#" \
        -e "s#^dir = \"../data/audit\"#dir = \"$ROOT/$OUT/audit-$side\"#" \
        -e "0,/^max_batch = [0-9]* /s//max_batch = $MB /" -e "s#^parallel = [a-z]* #parallel = $PAR #" \
        config/tiergate.toml > "$OUT/config-$side.toml"
    start_tiergate "$OUT/config-$side.toml" $PORT $((PORT + 1)) "$OUT/serve-$side.log"
    U=http://127.0.0.1:$PORT/v1/classify
    "$OL" --url $U --rate 10 --duration 15 --data tests/data/test_sample.jsonl --min-bytes 1501 --pid "$SERVER" \
        --label "$side long rep$rep" --json "$OUT/report.jsonl" > /dev/null
    "$OL" --url $U --rates "${AB_RATES:-200,400,600,800,1000}" --duration 8 --data tests/data/ood_short.jsonl --max-bytes 200 \
        --pid "$SERVER" --label "$side short rep$rep" --json "$OUT/report.jsonl" --stop-on-saturation > /dev/null
    kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
  done
done
echo "target/model_ab/report.jsonl: $(wc -l < "$OUT/report.jsonl") measurements"
