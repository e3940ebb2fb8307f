#!/usr/bin/env bash
# End-to-end benchmark, one command (from anywhere):  benches/e2e.sh
#
# 1. builds tiergate, the load generator (benches/openloop.rs) and the ceiling bench; creates
#    the Python baseline's venv (benches/baselines/setup.sh);
# 2. waits for an idle machine (no rustc/cargo, 1-min load < 0.5), and logs any compiler that
#    starts during the run to interference.log;
# 3. the raw ONNX Runtime ceiling on the same messages (cargo bench --bench ceiling -- stream:
#    1 session x 2 threads, 2 sessions x 1 thread, batch sizes 1..16);
# 4. for each server: tiergate (2 sessions x 1 thread) with micro-batching off and on, tiergate
#    with the former defaults (1 session x 2 threads, max_batch 8) and the same with batching
#    off (max_batch 1), the FastAPI baseline with
#    1 and 2 uvicorn workers (same 2-thread budget): an unloaded run (20 requests/s) and an open-loop
#    rate sweep, on short and on long messages; the server is started fresh for every rate
#    (so a saturated rate leaves no backlog or state behind) and the sweep stops after two
#    saturated rates in a row; RSS and CPU of the server are sampled under load; a measurement
#    during which a compiler ran, or other processes used more than 0.15 cores, is repeated;
#    the sweep's rates are fractions of the ceiling measured in step 3 (E2E_FRACTIONS), so they
#    mean the same on any machine, and it goes on until two saturated rates in a row;
# 5. overload, for the servers in E2E_OVERLOAD (default: tiergate's shipped settings and the
#    1-worker baseline; E2E_SHIPPED names the former): 1.5x and 3x the sustainable rate the sweep found, and a burst (3x for
#    5 s between 0.5x phases): model goodput, rules answers and their latency, answers later than
#    the deadline + 5 ms, and the time until p99 is back under 50 ms after the burst;
# 6. prints and saves one side-by-side report (benches/e2e_report.py).
#
# Output: target/e2e/<timestamp>/ (results.jsonl, ceiling.txt, report.md, logs).
# Knobs (env): E2E_DURATION (measured s per rate, 5), E2E_WARMUP (1.5), E2E_FRACTIONS (of the
# ceiling), E2E_SHORT_RATES / E2E_LONG_RATES (absolute rates instead), E2E_OVERLOAD, E2E_ONLY (space-separated subset of: tg-off tg-on tg-1x2 tg-1x2-off py-1w py-2w, and tg-before with E2E_BEFORE),
# E2E_KINDS (short long: the message sets swept),
# E2E_SKIP_IDLE_WAIT=1 and E2E_SKIP_CEILING=1 (smoke tests only), E2E_TG_OFF / E2E_TG_ON ([model] settings, "key=value ...").
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="${E2E_OUT:-$ROOT/target/e2e/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
DURATION="${E2E_DURATION:-5}"
WARMUP="${E2E_WARMUP:-1.5}"
FRACTIONS="${E2E_FRACTIONS:-0.3,0.5,0.7,0.8,0.85,0.9,0.95,1.0,1.1,1.25,1.5}"
SHIPPED="${E2E_SHIPPED:-tg-on}"  # the settings config/tiergate.toml ships (max_batch = 4, a batch-invariant model)
OVERLOAD="${E2E_OVERLOAD:-$SHIPPED py-1w}"
DEADLINE_MS=200  # config/tiergate.toml default_deadline_ms
ONLY="${E2E_ONLY:-tg-off tg-on tg-1x2 tg-1x2-off py-1w py-2w}"
KINDS="${E2E_KINDS:-short long}"
# The model's thread budget is 2 for every server. tiergate: two sessions of 1 intra-op thread
# (2x1, the fastest layout here, see docs/BENCHMARKS.md), micro-batching off (max_batch 1) and
# on (the best settings of the exploration there, now the shipped defaults); and the former defaults of
# config/tiergate.toml (one session of 2 threads, max_batch 8, no queue delay).
TG_OFF="${E2E_TG_OFF:-sessions=2 intra_threads=1 max_batch=1 max_queue_delay_us=0}"
TG_ON="${E2E_TG_ON:-sessions=2 intra_threads=1 max_batch=4 max_queue_delay_us=0}"
TG_1X2="sessions=1 intra_threads=2 max_batch=8 max_queue_delay_us=0"
TG_1X2_OFF="sessions=1 intra_threads=2 max_batch=1 max_queue_delay_us=0"
THREADS=2  # the thread budget for the model, both servers
PORT=18080
ADMIN_PORT=19090
SHORT=(--data tests/data/ood_short.jsonl --max-bytes 159)   # ~10-40 tokens, as the ceiling's short set
LONG=(--data tests/data/test_sample.jsonl --min-bytes 1501) # truncated to 128 tokens, as its long set

log() { echo "[e2e $(date +%T)] $*" | tee -a "$OUT/e2e.log" >&2; }

# ---- 1. build -------------------------------------------------------------------------
log "building (cargo build --release; benches openloop, ceiling)"
cargo build --release --quiet
OPENLOOP="$(benches/bench_bin.sh openloop)"
CEILING="$(benches/bench_bin.sh ceiling)"
[[ -x "$OPENLOOP" && -x "$CEILING" ]] || { log "bench binaries not found"; exit 1; }
TIERGATE="$ROOT/target/release/tiergate"
# E2E_BEFORE: a checkout of an earlier commit (git worktree), for before/after cost in one run as
# the server "tg-before"; its binary is E2E_BEFORE_BIN (default: its own target/release/tiergate).
BEFORE="${E2E_BEFORE:-}"; BEFORE_BIN="${E2E_BEFORE_BIN:-$BEFORE/target/release/tiergate}"
if [[ " ${E2E_ONLY:-} " == *" tg-before "* ]]; then
    [[ -d "$BEFORE" && -x "$BEFORE_BIN" ]] || { log "tg-before needs E2E_BEFORE (a built checkout) or E2E_BEFORE_BIN"; exit 1; }
fi
benches/baselines/setup.sh
PY="$ROOT/benches/baselines/.venv/bin"

# ---- 2. an idle machine ----------------------------------------------------------------
cpu_busy_pct() {  # share of CPU time busy over 2 s, from /proc/stat
    local a b
    read -r _ a1 a2 a3 a4 a5 a6 a7 _ < /proc/stat; sleep 2
    read -r _ b1 b2 b3 b4 b5 b6 b7 _ < /proc/stat
    local busy=$(( (b1+b2+b3+b6+b7) - (a1+a2+a3+a6+a7) )) idle=$(( (b4+b5) - (a4+a5) ))
    echo $(( 100 * busy / (busy + idle + 1) ))
}
wait_idle() {  # $1 = "start": also require the 1-min load average < 0.5
    [[ "${E2E_SKIP_IDLE_WAIT:-0}" == 1 ]] && return
    while true; do
        local compilers load busy
        compilers="$(pgrep -x rustc; pgrep -x cargo)" || true
        load="$(cut -d' ' -f1 /proc/loadavg)"
        busy="$(cpu_busy_pct)"
        if [[ -z "$compilers" && "$busy" -lt 15 ]] && { [[ "${1:-}" != start ]] || python3 -c "import sys; sys.exit(0 if $load < 0.5 else 1)"; }; then
            log "idle: no rustc/cargo, load ${load}, CPU busy ${busy}% over 2 s"
            return
        fi
        log "waiting for an idle machine (compilers: ${compilers//$'\n'/ } load ${load} busy ${busy}%)"
        sleep 30
    done
}
wait_idle start
touch "$OUT/interference.log"
( while sleep 1; do
      c="$(pgrep -x rustc; pgrep -x cargo)" || true
      [[ -n "$c" ]] && echo "$(date +%T) compiler running: ${c//$'\n'/ }" >> "$OUT/interference.log"
      true
  done ) &
WATCHER=$!
SERVER=""
cleanup() { [[ -n "$SERVER" ]] && kill "$SERVER" 2>/dev/null; kill "$WATCHER" 2>/dev/null; true; }
trap cleanup EXIT
{
    echo "date: $(date -Is)"
    echo "host: $(nproc) cores, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
    echo "kernel: $(uname -r)"
    echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src Cargo.toml benches || echo ' (+ uncommitted changes)')"
    [[ -n "$BEFORE" ]] && echo "before: $(git -C "$BEFORE" rev-parse --short HEAD) ($BEFORE_BIN)"
    echo "rustc: $(rustc --version)"
    echo "python: $("$PY/python" --version) onnxruntime $("$PY/python" -c 'import onnxruntime; print(onnxruntime.__version__)')"
    echo "duration: ${DURATION}s measured + ${WARMUP}s warm-up per rate, uniform arrivals"
} > "$OUT/machine.txt"

# ---- 3. the ceiling --------------------------------------------------------------------
log "ceiling: raw ONNX Runtime on the same message stream (cargo bench --bench ceiling -- stream)"
if [[ "${E2E_SKIP_CEILING:-0}" != 1 ]]; then
    for attempt in 1 2 3; do
        before="$(wc -l < "$OUT/interference.log")"
        CRITERION_HOME="$OUT/criterion" "$CEILING" --bench stream > "$OUT/ceiling.txt" 2>&1
        [[ "$(wc -l < "$OUT/interference.log")" == "$before" ]] && break
        log "a compiler ran during the ceiling bench (attempt $attempt): measuring again when idle"
        wait_idle
    done
fi
wait_idle
# Rates as fractions of the ceiling (fallback when the ceiling was skipped: the old fixed rates).
rates_for() {  # kind -> comma-separated rates
    local c; c="$(python3 benches/e2e_report.py --ceiling "$OUT" "$1")"
    if [[ -z "$c" ]]; then [[ $1 == short ]] && echo 100,300,500,700,900,1100 || echo 20,50,80,110,140; return; fi
    python3 -c "import sys; print(','.join(str(max(1, round(float(f) * $c))) for f in sys.argv[1].split(',')))" "$FRACTIONS"
}
SHORT_RATES="${E2E_SHORT_RATES:-$(rates_for short)}"
LONG_RATES="${E2E_LONG_RATES:-$(rates_for long)}"
log "rates: short $SHORT_RATES; long $LONG_RATES"

# ---- 4. servers ------------------------------------------------------------------------
tg_config() {  # $1 = "key=value ..." for [model] -> a config file
    local file="$OUT/tiergate-$2.toml" expr="" kv
    for kv in $1; do
        expr+="/^\[model\]/,/^\[/ s/^${kv%%=*} = [^#]*#/${kv%%=*} = ${kv#*=}   #/;"
    done
    sed -e "$expr" config/tiergate.toml > "$file"
    echo "$file"
}
start_server() {  # $1 = config name; sets SERVER (pid) and URL
    local name="$1"
    case "$name" in
        tg-before)  # an earlier commit, served as it shipped: its own binary, config, model, policies
            (cd "$BEFORE" && exec "$BEFORE_BIN" serve --listen 127.0.0.1:$PORT --admin-listen 127.0.0.1:$ADMIN_PORT \
                >> "$OUT/$name.log" 2>&1) &
            SERVER=$!; URL="http://127.0.0.1:$PORT/v1/classify"; local ready="http://127.0.0.1:$PORT/readyz";;
        tg-*)
            local cfg="$OUT/tiergate-$name.toml"
            "$TIERGATE" serve --config "$cfg" --models "$ROOT/models" --policies "$ROOT/policies" \
                --listen 127.0.0.1:$PORT --admin-listen 127.0.0.1:$ADMIN_PORT >> "$OUT/$name.log" 2>&1 &
            SERVER=$!; URL="http://127.0.0.1:$PORT/v1/classify"; local ready="http://127.0.0.1:$PORT/readyz";;
        py-*)
            local workers="${name#py-}"; workers="${workers%w}"
            # the same 2-thread budget: 1 worker x 2 intra-op threads, or 2 workers x 1
            BASELINE_INTRA_THREADS=$(( THREADS / workers )) "$PY/uvicorn" --app-dir benches/baselines fastapi_server:app \
                --host 127.0.0.1 --port $PORT --workers "$workers" --log-level warning --no-access-log \
                --timeout-keep-alive 75 --backlog 4096 >> "$OUT/$name.log" 2>&1 &
            SERVER=$!; URL="http://127.0.0.1:$PORT/v1/classify"; local ready="http://127.0.0.1:$PORT/healthz";;
    esac
    for _ in $(seq 300); do
        curl -sf -o /dev/null "$ready" && break
        kill -0 "$SERVER" 2>/dev/null || { log "$name died on start"; tail -5 "$OUT/$name.log"; exit 1; }
        sleep 0.1
    done
    # every worker process up (uvicorn --workers 2 answers before both are)
    [[ "$name" == py-2w ]] && sleep 2
    # one request of each kind: the first inference of a session is slow
    curl -sf -o /dev/null "$URL" -H 'content-type: application/json' -d '{"text":"warm up"}'
}
stop_server() {
    kill "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
    SERVER=""
    # the port free again
    for _ in $(seq 50); do ss -ltn "sport = :$PORT" | grep -q LISTEN || break; sleep 0.1; done
}
# One measurement against a fresh server, repeated (after waiting for an idle machine) when a
# compiler ran during it; the row goes to $OUT/<jsonfile> only when clean.
# Returns 1 when the rate saturated the server.
measure() {  # name jsonfile label rate openloop-args...
    local name="$1" jsonfile="$2" label="$3" rate="$4"; shift 4
    local degr=(); [[ "$name" == py-* ]] && degr=(--no-degraded)
    for attempt in 1 2 3 4 5; do
        if pgrep -x rustc > /dev/null || pgrep -x cargo > /dev/null; then wait_idle; fi
        local before; before="$(wc -l < "$OUT/interference.log")"
        start_server "$name"
        rm -f "$OUT/one.jsonl"
        local rate_args=(--rate "$rate" --duration "$DURATION" --warmup "$WARMUP")
        [[ "$rate" == 0 ]] && rate_args=()  # --phases in "$@"
        nice -n -5 "$OPENLOOP" --url "$URL" "${rate_args[@]}" \
            --pid "$SERVER" --label "$label" "${degr[@]}" --json "$OUT/one.jsonl" "$@" > "$OUT/one.txt"
        stop_server
        local other; other="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["other_cpu_cores"] or 0)' "$OUT/one.jsonl")"
        if [[ "$(wc -l < "$OUT/interference.log")" == "$before" ]] && python3 -c "import sys; sys.exit(0 if $other <= 0.15 else 1)"; then
            sed -n 2p "$OUT/one.txt" | tee -a "$OUT/table.txt"
            cat "$OUT/one.jsonl" >> "$OUT/$jsonfile"
            ! grep -q '"saturated":true' "$OUT/one.jsonl"
            return
        fi
        log "a compiler or other work (${other} cores) ran during $label at $rate/s (attempt $attempt): discarded, measuring again when idle"
        sed -n 2p "$OUT/one.txt" | sed 's/^/(discarded) /' >> "$OUT/table.txt"
        wait_idle
    done
    log "no clean measurement of $label at $rate/s after 5 attempts"; exit 1
}

echo "$SHIPPED" > "$OUT/shipped.txt"
tg_config "$TG_OFF" tg-off > /dev/null
tg_config "$TG_ON" tg-on > /dev/null
tg_config "$TG_1X2" tg-1x2 > /dev/null
tg_config "$TG_1X2_OFF" tg-1x2-off > /dev/null
echo "label offered achieved goodput p50 p95 p99 max svc_p50 degraded err tmo unsent conns srvCPU cliCPU RSS_MB" > "$OUT/table.txt"
for name in $ONLY; do
    for kind in $KINDS; do
        if [[ $kind == short ]]; then args=("${SHORT[@]}"); rates="$SHORT_RATES"; else args=("${LONG[@]}"); rates="$LONG_RATES"; fi
        log "$name $kind: unloaded (20/s)"
        measure "$name" unloaded.jsonl "$name/$kind/unloaded" 20 "${args[@]}" || true
        log "$name $kind: sweep $rates"
        saturated=0
        for rate in ${rates//,/ }; do
            if measure "$name" results.jsonl "$name/$kind" "$rate" "${args[@]}"; then
                saturated=0
            else
                saturated=$((saturated + 1))
                # two in a row: a single one may be a transient (see the cpu-tier latch in docs/BENCHMARKS.md)
                [[ $saturated -ge 2 ]] && { log "$name $kind saturated at two rates in a row: sweep stopped at $rate/s"; break; }
            fi
        done
    done
    wait_idle
done

# ---- 5. overload ---------------------------------------------------------------------------
sustainable() {  # label -> the highest sustained goodput of the sweep (0 when none)
    python3 -c 'import json,sys
rows=[json.loads(l) for l in open(sys.argv[1])]
print(max([r["goodput_rps"] for r in rows if r["label"]==sys.argv[2] and r["sustained"]] or [0]))' "$OUT/results.jsonl" "$1"
}
for name in $OVERLOAD; do
    [[ " $ONLY " == *" $name "* ]] || continue
    for kind in $KINDS; do
        if [[ $kind == short ]]; then args=("${SHORT[@]}"); else args=("${LONG[@]}"); fi
        s="$(sustainable "$name/$kind")"
        [[ "$s" == 0 ]] && s="$(sustainable "$SHIPPED/$kind")"
        if [[ "$s" == 0 ]]; then  # nothing sustained at p99 < 50 ms: half the ceiling stands in
            s="$(python3 -c "c='$(python3 benches/e2e_report.py --ceiling "$OUT" "$kind")'; print(round(0.5 * float(c or 0)))")"
            log "$name $kind: no sustainable rate in the sweep: overload relative to half the ceiling, $s/s"
        fi
        [[ "$s" == 0 ]] && { log "$name $kind: no ceiling either: no overload points"; continue; }
        for x in 1.5 3; do
            rate="$(python3 -c "print(round($x * $s))")"
            log "$name $kind: overload ${x}x the sustainable $s/s = $rate/s"
            measure "$name" overload.jsonl "$name/$kind/${x}x" "$rate" "${args[@]}" --deadline-ms $DEADLINE_MS || true
        done
        phases="$(python3 -c "s=$s; print(f'{round(0.5*s)}:3,{round(3*s)}:5,{round(0.5*s)}:8')")"
        log "$name $kind: burst $phases (rate:seconds)"
        measure "$name" overload.jsonl "$name/$kind/burst" 0 "${args[@]}" --deadline-ms $DEADLINE_MS \
            --phases "$phases" --warmup 1 || true
    done
done
kill "$WATCHER" 2>/dev/null || true

# ---- 6. report -------------------------------------------------------------------------
python3 benches/e2e_report.py "$OUT" | tee "$OUT/report.md"
log "results in $OUT"
