#!/usr/bin/env bash
# A retry storm against the shipped config: closed-loop clients (`wrk`, every connection sends
# its next request as soon as the last is answered) at a few connections and at many, the same
# short messages, one fresh server per run. With many connections the rules answer whatever the
# model has no room for, at once, and those clients come straight back: this shows whether that
# cheap path eats the CPU the model workers need (issue 28: the model's answers/s at 256
# connections must stay >= 0.9x those at 4).
#
#   benches/closed_loop.sh [CONNECTIONS...]      (default: 4 256)
#
# Env: CLOSED_DURATION (measured s per run, 15), CLOSED_DATA (tests/data/ood_short.jsonl, e2e.sh's
# short set), CLOSED_CONFIG (config/tiergate.toml), CLOSED_REPEAT (runs per connection count, 1).
# Needs wrk (Debian: apt-get install wrk). Run on an idle machine.
# Prints, per run: requests/s, the model's answers/s (cpu-tier stage outcomes that ran the model,
# from /metrics), the rules' answers/s (decisions by the rules tier), p50/p99 of all answers
# (wrk), the server's and wrk's CPU in cores. Output: target/closed_loop/<timestamp>/.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
source benches/lib.sh
SERVER=""
trap '[[ -n "$SERVER" ]] && kill $SERVER 2>/dev/null || true' EXIT
CONNS=("$@")
[[ $# -eq 0 ]] && CONNS=(4 256)
DURATION="${CLOSED_DURATION:-15}"
DATA="${CLOSED_DATA:-tests/data/ood_short.jsonl}"
CONFIG="${CLOSED_CONFIG:-config/tiergate.toml}"
REPEAT="${CLOSED_REPEAT:-1}"
PORT=18182
ADMIN_PORT=19192
OUT="$ROOT/target/closed_loop/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$OUT"
log() { echo "[closed_loop $(date +%T)] $*" >&2; }
command -v wrk > /dev/null || { echo "wrk not found (Debian: apt-get install wrk)" >&2; exit 2; }
log "building (cargo build --release)"
cargo build --release --quiet

# Cumulative CPU seconds of a process (all its threads), from /proc.
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }
# Counters from /metrics: the model's answers (cpu stages that ran the model) and the rules'.
counts() {
    curl -sf "http://127.0.0.1:$ADMIN_PORT/metrics" | python3 -c '
import re, sys
model = rules = 0.0
ran = {"accepted", "low_confidence", "out_of_distribution", "unread", "language"}
for line in sys.stdin:
    m = re.match(r"tiergate_stage_outcomes_total\{tier=\"(\w+)\",outcome=\"(\w+)\"\} (\S+)", line)
    if m and m[1] == "cpu" and m[2] in ran:
        model += float(m[3])
    m = re.match(r"tiergate_decisions_total\{tier=\"rules\",action=\"\w+\"\} (\S+)", line)
    if m:
        rules += float(m[1])
print(model, rules)'
}

printf '%-6s %-4s %9s %9s %9s %8s %8s %8s %8s\n' conns run 'req/s' 'model/s' 'rules/s' 'p50 ms' 'p99 ms' 'srvCPU' 'wrkCPU' | tee "$OUT/report.txt"
for conns in "${CONNS[@]}"; do
    for run in $(seq "$REPEAT"); do
        start_tiergate "$CONFIG" $PORT $ADMIN_PORT "$OUT/server-$conns-$run.log"
        URL="http://127.0.0.1:$PORT/v1/classify"
        # Warm-up: the sessions' first runs and the regex caches.
        TIERGATE_BENCH_DATA="$DATA" wrk -t1 -c4 -d2s -s benches/classify.lua "$URL" > /dev/null
        read -r model0 rules0 < <(counts)
        cpu0=$(cpu_s $SERVER)
        start=$(date +%s.%N)
        TIERGATE_BENCH_DATA="$DATA" /usr/bin/time -f '%U %S' -o "$OUT/wrk-$conns-$run.time" \
            wrk -t1 -c"$conns" -d"${DURATION}s" --latency -s benches/classify.lua "$URL" > "$OUT/wrk-$conns-$run.txt"
        elapsed=$(echo "$(date +%s.%N) - $start" | bc)
        cpu1=$(cpu_s $SERVER)
        read -r model1 rules1 < <(counts)
        kill $SERVER; wait $SERVER 2>/dev/null || true
        python3 - "$conns" "$run" "$OUT/wrk-$conns-$run.txt" "$OUT/wrk-$conns-$run.time" "$DURATION" "$elapsed" \
            "$model0" "$model1" "$rules0" "$rules1" "$cpu0" "$cpu1" <<'EOF' | tee -a "$OUT/report.txt"
import re, sys
conns, run, wrk_txt, wrk_time, duration, elapsed = sys.argv[1:7]
model0, model1, rules0, rules1, cpu0, cpu1 = map(float, sys.argv[7:13])
text = open(wrk_txt).read()
rps = float(re.search(r"Requests/sec:\s+(\S+)", text)[1])
def ms(q):
    m = re.search(rf"^\s+{q}%\s+(\S+?)(us|ms|s)$", text, re.M)
    return float(m[1]) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m[2]]
d = float(elapsed)  # the counters' window: wrk's duration and its start-up
user, system = map(float, open(wrk_time).read().split()[-2:])
print(f"{conns:<6} {run:<4} {rps:9.0f} {(model1 - model0) / d:9.0f} {(rules1 - rules0) / d:9.0f} "
      f"{ms(50):8.2f} {ms(99):8.2f} {(cpu1 - cpu0) / float(elapsed):8.2f} {(user + system) / float(duration):8.2f}")
EOF
    done
done
log "done: $OUT"
