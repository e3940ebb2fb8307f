#!/usr/bin/env bash
# Where the server's CPU goes under sustained load, by thread and by function: the shipped config,
# bundled model and policies, open-loop short messages at RATE/s for SECONDS, `perf record` on the
# server meanwhile.
#
#   benches/profile.sh [RATE] [SECONDS]        (defaults: 200 requests/s, 20 s)
#
# Env: PROFILE_CONFIG (the server config, config/tiergate.toml), PROFILE_DATA / PROFILE_MAX_BYTES (the messages: tests/data/ood_short.jsonl up to 159 bytes,
# as benches/e2e.sh's short set), PROFILE_FREQ (perf samples/s per CPU, 499), PROFILE_CALL_GRAPH (perf's
# --call-graph mode, e.g. dwarf: callers of every sample, written to callers.txt; off by default,
# since unwinding costs the server CPU of its own).
# Needs perf (Debian: linux-perf) and permission to profile another process (root, or
# kernel.perf_event_paranoid <= 1). Run on an idle machine.
# Output: target/profile/<timestamp>/: openloop.txt and .jsonl (the load, the server's CPU per request by
# thread), by_thread.txt (samples by thread), by_thread_library.txt (by thread and library: ONNX
# Runtime, tiergate, libc, kernel), by_function.txt (self time by function),
# by_thread_function.txt (the same per thread), perf.data.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
source benches/lib.sh
RATE="${1:-200}"
SECONDS_="${2:-20}"
DATA="${PROFILE_DATA:-tests/data/ood_short.jsonl}"
MAX_BYTES="${PROFILE_MAX_BYTES:-159}"
FREQ="${PROFILE_FREQ:-499}"
CALL_GRAPH=()
[[ -n "${PROFILE_CALL_GRAPH:-}" ]] && CALL_GRAPH=(--call-graph "$PROFILE_CALL_GRAPH")
PORT=18181
ADMIN_PORT=19191
OUT="$ROOT/target/profile/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$OUT"
log() { echo "[profile $(date +%T)] $*" >&2; }
command -v perf > /dev/null || { echo "perf not found (Debian: apt-get install linux-perf)" >&2; exit 2; }

log "building (cargo build --release; bench openloop)"
cargo build --release --quiet
OPENLOOP="$(benches/bench_bin.sh openloop)"

SERVER=""
trap '[[ -n "$SERVER" ]] && kill $SERVER 2>/dev/null || true' EXIT
start_tiergate "${PROFILE_CONFIG:-config/tiergate.toml}" $PORT $ADMIN_PORT "$OUT/server.log"
URL="http://127.0.0.1:$PORT/v1/classify"
curl -sf -o /dev/null "$URL" -H 'content-type: application/json' -d '{"text":"warm up"}'

log "load: $RATE/s for ${SECONDS_} s (+2 s warm-up), perf at $FREQ Hz on pid $SERVER"
# perf starts after the warm-up and stops before the drain.
(sleep 2 && exec perf record -F "$FREQ" "${CALL_GRAPH[@]}" -p $SERVER -o "$OUT/perf.data" -- sleep "$SECONDS_") \
    > "$OUT/perf.log" 2>&1 &
PERF=$!
"$OPENLOOP" --url "$URL" --rate "$RATE" --duration "$SECONDS_" --warmup 2 --data "$DATA" \
    --max-bytes "$MAX_BYTES" --pid $SERVER --json "$OUT/openloop.jsonl" | tee "$OUT/openloop.txt"
wait $PERF || true

report() { perf report -i "$OUT/perf.data" --no-children --stdio "$@" 2>/dev/null | grep -v '^$'; }
report --sort comm > "$OUT/by_thread.txt"
report --sort comm,dso > "$OUT/by_thread_library.txt"
report --sort symbol --percent-limit 0.3 | sed -n 1,80p > "$OUT/by_function.txt"
report --sort comm,symbol --percent-limit 0.3 | sed -n 1,120p > "$OUT/by_thread_function.txt"
if [[ -n "${PROFILE_CALL_GRAPH:-}" ]]; then
    perf report -i "$OUT/perf.data" --children --stdio --percent-limit 0.5 -g caller,0.5,callee \
        --sort symbol 2>/dev/null | grep -v '^$' | sed -n 1,4000p > "$OUT/callers.txt"
fi
log "done: $OUT"
grep -v '^#' "$OUT/by_thread.txt" | sed -n 1,12p
grep -v '^#' "$OUT/by_function.txt" | sed -n 1,30p
