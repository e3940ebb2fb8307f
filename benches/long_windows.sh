#!/usr/bin/env bash
# Long-text latency with `[model.windows] parallel` off and on, side by side in one run.
# Usage: benches/long_windows.sh MODEL_DIR [POLICY_DIR]   (a static-QDQ model: the setting is for those)
# For each setting: a fresh `tiergate serve` (the bundled config, max_batch 4, MODEL_DIR, POLICY_DIR or policies/),
# the open-loop harness at 10 long texts/s for 20 s (tests/data/test_sample.jsonl, >= 1,501 bytes), one 16,000-byte
# text 20 times in a row, then 20 short messages/s for 10 s. JSON lines in target/long_windows/report.jsonl.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"; cd "$ROOT"
MODEL="$(realpath "${1:?usage: benches/long_windows.sh MODEL_DIR [POLICY_DIR]}")"; POL="$(realpath "${2:-policies}")"
OUT=target/long_windows; mkdir -p "$OUT"; : > "$OUT/report.jsonl"; PORT=${PORT:-18090}
cargo build --release -q && cargo bench --bench openloop --no-run -q 2>/dev/null
OL=$(ls -t target/release/deps/openloop-* | grep -v '\.d$' | head -1)
for par in false true; do
  sed -e "s#^dir = \"../models\"#dir = \"$MODEL\"#" -e "s#^dir = \"../policies\"#dir = \"$POL\"#" \
      -e "s#^dir = \"../data/audit\"#dir = \"$ROOT/$OUT/audit\"#" -e "s#^listen = \"127.0.0.1:8080\"#listen = \"127.0.0.1:$PORT\"#" \
      -e "0,/^max_batch = [0-9]* /s//max_batch = 4 /" -e "s#^parallel = [a-z]* #parallel = $par #" config/tiergate.toml > "$OUT/config.toml"
  grep -q "^parallel = $par " "$OUT/config.toml" || { echo "config/tiergate.toml has no 'parallel = ...' line" >&2; exit 1; }
  target/release/tiergate serve --config "$OUT/config.toml" > "$OUT/serve.log" 2>&1 & pid=$!
  trap 'kill $pid 2>/dev/null' EXIT
  for _ in $(seq 1 60); do curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null && break; sleep 1; done
  URL="http://127.0.0.1:$PORT/v1/classify"
  "$OL" --url "$URL" --rate 10 --duration 20 --data tests/data/test_sample.jsonl --min-bytes 1501 --pid $pid --label "long parallel=$par" --json "$OUT/report.jsonl" | tail -3
  URL="$URL" PAR=$par python3 - <<'PY'
import json, os, time, urllib.request
text = ("Dear customer, your account statement for the period is ready. " * 300)[:16000]
times = []
for _ in range(20):
    req = urllib.request.Request(os.environ["URL"], json.dumps({"text": text}).encode(),
                                 {"content-type": "application/json", "x-tiergate-deadline-ms": "2000"})
    start = time.perf_counter(); urllib.request.urlopen(req).read(); times.append((time.perf_counter() - start) * 1000)
times.sort()
print(f"16000-byte text parallel={os.environ['PAR']}: p50 {times[10]:.1f} ms, p90 {times[18]:.1f} ms")
PY
  "$OL" --url "$URL" --rate 20 --duration 10 --data tests/data/ood_short.jsonl --max-bytes 159 --pid $pid --label "short parallel=$par" --json "$OUT/report.jsonl" | tail -2
  kill $pid; wait $pid 2>/dev/null || true
done
