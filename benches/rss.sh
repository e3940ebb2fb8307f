#!/usr/bin/env bash
# Resident memory of `tiergate serve` with the bundled config: idle after start, after long texts
# (tests/data/test_sample.jsonl >= 1,501 bytes, read whole) at 10/s for 10 s, then after a
# multilingual stream (tests/data/blind_ml6.jsonl, 21 languages, ~10 % long) at RSS_RATE/s (400)
# for 8 s, which overloads two cores. Prints VmRSS and VmHWM (the peak) after each step.
#
#   benches/rss.sh [BIN]     (default target/release/tiergate; give two binaries' runs side by side)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"; cd "$ROOT"
. benches/lib.sh
BIN="${1:-target/release/tiergate}"
OL="$(benches/bench_bin.sh openloop)"
OUT=target/rss; mkdir -p "$OUT"; PORT=$(free_port); ADMIN=$(free_port)
sed -e "s#^dir = \"../models\"#dir = \"$ROOT/models\"#" -e "s#^dir = \"../policies\"#dir = \"$ROOT/policies\"#" \
    -e "s#^dir = \"../data/audit\"#dir = \"$ROOT/$OUT/audit\"#" config/tiergate.toml > "$OUT/config.toml"
start_tiergate "$OUT/config.toml" "$PORT" "$ADMIN" "$OUT/serve.log" "$BIN"
trap 'kill $SERVER 2>/dev/null || true' EXIT
rss() { printf '%-28s' "$1"; awk '/VmRSS|VmHWM/{printf "%s %4d MB   ", $1, int($2/1024)}' "/proc/$SERVER/status"; echo; }
U="http://127.0.0.1:$PORT/v1/classify"
rss "idle:"
"$OL" --url "$U" --rate 10 --duration 10 --data tests/data/test_sample.jsonl --min-bytes 1501 --pid "$SERVER" > /dev/null
rss "after long texts at 10/s:"
"$OL" --url "$U" --rate "${RSS_RATE:-400}" --duration 8 --data tests/data/blind_ml6.jsonl --pid "$SERVER" > /dev/null
rss "after blind_ml6 at ${RSS_RATE:-400}/s:"
