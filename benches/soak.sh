#!/usr/bin/env bash
# Soak: tiergate under steady load for SOAK_DURATION s (default 600) at SOAK_RATE requests/s
# (default 100: about half of what this 2-core machine sustains for short messages, see
# docs/BENCHMARKS.md), half `POST /v1/classify`, half screened chat through a proxy route to two
# stub apps, while benches/soak.py injects faults every minute (app 500s, app down, policy
# edits valid and invalid, a flood past max_concurrent_requests, slow clients). Passes when no
# request failed other than intended sheds (429/503 with Retry-After) and the app's own relayed
# 500s, and the server's RSS grew less than 5 % after the warm-up (SOAK_WARMUP, 300 s: five
# fault cycles; see benches/soak.py).
#
#   cargo build --release && benches/soak.sh            # report in target/soak/<time>/
#   SOAK_DURATION=120 SOAK_RATE=50 benches/soak.sh      # a short try
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
BIN=${TIERGATE_BIN:-target/release/tiergate}
[ -x "$BIN" ] || { echo "no $BIN: run cargo build --release first" >&2; exit 1; }
OUT=target/soak/$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$OUT/policies"
cp policies/*.toml "$OUT/policies/"
PORT=$(free_port); ADMIN=$(free_port); APP_A=$(free_port); APP_B=$(free_port)
cat > "$OUT/tiergate.toml" <<TOML
[server]
listen = "127.0.0.1:$PORT"
max_concurrent_requests = 64
[model]
dir = "$PWD/models"
[policies]
dir = "$PWD/$OUT/policies"
watch = true
[admin]
listen = "127.0.0.1:$ADMIN"
[proxy]
eject_after_failures = 3
eject_ms = 2000
[[routes]]
name = "chat"
path_prefix = "/chat"
methods = ["POST"]
upstream = ["http://127.0.0.1:$APP_A", "http://127.0.0.1:$APP_B"]
[routes.screen]
text = ["/messages/-1/content"]
TOML
"$BIN" serve --config "$OUT/tiergate.toml" > "$OUT/tiergate.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$ADMIN/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
echo "soak: tiergate pid $PID on :$PORT, apps :$APP_A :$APP_B, ${SOAK_DURATION:-600} s at ${SOAK_RATE:-100}/s; output in $OUT" >&2
python3 benches/soak.py --port "$PORT" --apps "$APP_A,$APP_B" --pid "$PID" \
  --policy-file "$OUT/policies/rules.toml" --rate "${SOAK_RATE:-100}" --duration "${SOAK_DURATION:-600}" --warmup "${SOAK_WARMUP:-300}" \
  --json "$OUT/report.json" | tee "$OUT/report.txt"
