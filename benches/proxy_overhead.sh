#!/usr/bin/env bash
# Pass-through proxy overhead: one upstream (nginx answering `return 200`) reached directly,
# through nginx (`proxy_pass` with upstream keep-alive) and through tiergate (a route without
# screening), at fixed request rates, measured by the open-loop generator (benches/openloop.rs,
# latency from each request's intended send time). Prints added p50/p99 over direct.
#
#   benches/proxy_overhead.sh                 # RATES=500,1000,2000,4000 DURATION=10 by default
#   TIERGATE_BIN=path/to/tiergate benches/proxy_overhead.sh   # another build (before/after)
#
# Needs nginx (Debian: `apt-get install nginx`). Everything runs on this machine's cores: the
# generator, the upstream, and the proxy under test (nginx: 2 workers; tiergate: its default
# runtime, one worker per core).
set -euo pipefail
cd "$(dirname "$0")/.."
RATES=${RATES:-500,1000,2000,4000}
DURATION=${DURATION:-10}
OUT=${OUT:-target/proxy-overhead}
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
REPO=$(pwd)
command -v nginx >/dev/null || { echo "nginx not found (apt-get install nginx)" >&2; exit 1; }

cargo build --release --bin tiergate
OPENLOOP="$(benches/bench_bin.sh openloop)"

cat > "$OUT/nginx.conf" <<EOF
worker_processes 2;
pid $OUT/nginx.pid;
error_log $OUT/nginx-error.log warn;
daemon off;
events { worker_connections 4096; }
http {
    access_log off;
    upstream app { server 127.0.0.1:18801; keepalive 128; }
    # The app: a fixed 2-byte answer.
    server { listen 127.0.0.1:18801; location / { return 200 'ok'; } }
    # nginx as the proxy under test.
    server {
        listen 127.0.0.1:18802;
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
        }
    }
}
EOF

cat > "$OUT/tiergate.toml" <<EOF
[server]
listen = "127.0.0.1:18803"
[admin]
listen = "127.0.0.1:18804"
[model]
dir = "$REPO/models"
[policies]
dir = "$REPO/policies"
watch = false
[[routes]]
name = "app"
upstream = ["http://127.0.0.1:18801"]
EOF

nginx -c "$OUT/nginx.conf" -p "$OUT" &
NGINX=$!
RUST_LOG=warn "${TIERGATE_BIN:-target/release/tiergate}" serve --config "$OUT/tiergate.toml" &
TIERGATE=$!
trap 'kill $NGINX $TIERGATE 2>/dev/null; wait 2>/dev/null' EXIT
for port in 18801 18802 18804; do
    for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
done
curl -sf -o /dev/null http://127.0.0.1:18803/ || { echo "tiergate did not start" >&2; exit 1; }

rm -f "$OUT/results.jsonl"
IFS=, read -ra rates <<<"$RATES"
for rate in "${rates[@]}"; do
    for target in direct:18801 nginx:18802 tiergate:18803; do
        "$OPENLOOP" --url "http://127.0.0.1:${target#*:}/" --rate "$rate" --duration "$DURATION" --warmup 2 \
            --data tests/data/ood_short.jsonl --no-degraded --label "${target%%:*}" --json "$OUT/results.jsonl" \
            --connections 512
    done
done

python3 benches/proxy_overhead_report.py "$OUT/results.jsonl"
