#!/usr/bin/env bash
# The audit trail's cost under load, audit off and on side by side in one run (issue 14):
#
# 1. builds tiergate and the open-loop load generator (benches/openloop.rs);
# 2. finds today's maximum short-message rate with the audit trail off: an open-loop sweep over
#    AUDIT_SWEEP (requests/s) on tests/data/ood_short.jsonl; the highest rate that is sustained
#    (no errors, goodput >= 99 % of offered, p99 < 50 ms) is MAX (or set AUDIT_MAX to skip it);
# 3. at AUDIT_LOAD (0.8) x MAX, runs the server AUDIT_REPEATS (7) times with the trail off and
#    on, alternating (off on off on ...), a fresh server and store each time, AUDIT_DURATION (10)
#    measured seconds after 2 s of warm-up: goodput, p50/p99 and the server's CPU ms per request;
# 4. after each run with the trail on: SIGTERM (which flushes the trail), then counts the records
#    in the store — all, distinct request ids, kind "classify" — against the /v1/classify 200s that
#    tiergate itself counted (`tiergate_http_responses_total{status="200"}`, read before the stop,
#    less the readiness check's one /readyz 200);
#    every answered request must have exactly one record;
# 5. prints one table (and writes it to target/audit_cost/<time>/report.md).
#
# Throughput cost: at a rate below saturation both servers answer everything, so the cost shows
# as CPU per request; on this CPU-bound path the sustainable rate scales with its inverse, so
# cost = cpu_on / cpu_off - 1. On a shared 2-core VM the model's own CPU per request moves by
# several % from one server to the next, more than the trail costs, so the report also
# attributes it by thread: the writer thread's CPU per request (`tiergate-audit`) plus the
# change in the runtime threads' (`tokio-rt-worker`, where the request path builds and queues
# the record), over the trail-off CPU per request.
#
#   benches/audit_cost.sh                       # about 6 minutes after the build
#   AUDIT_MAX=350 benches/audit_cost.sh         # without the sweep
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
. benches/lib.sh
OUT="$ROOT/target/audit_cost/$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$OUT"
SWEEP="${AUDIT_SWEEP:-200,250,300,350,400,450,500,550,600}"
LOAD="${AUDIT_LOAD:-0.8}"
REPEATS="${AUDIT_REPEATS:-7}"
DURATION="${AUDIT_DURATION:-10}"
DATA="$ROOT/tests/data/ood_short.jsonl"
log() { echo "[audit_cost $(date +%H:%M:%S)] $*" >&2; }

log "building"
cargo build --release --bin tiergate >&2
OPENLOOP="$(benches/bench_bin.sh openloop)"
BIN="$ROOT/target/release/tiergate"

PID=""
start_server() {  # audit: on|off; sets PORT ADMIN PID DIR
  local audit=$1
  PORT=$(free_port); ADMIN=$(free_port); DIR="$OUT/run-$RANDOM"
  mkdir -p "$DIR"
  {
    echo "[server]"; echo "listen = \"127.0.0.1:$PORT\""
    echo "[admin]"; echo "listen = \"127.0.0.1:$ADMIN\""
    echo "[model]"; echo "dir = \"$ROOT/models\""
    echo "[policies]"; echo "dir = \"$ROOT/policies\""; echo "watch = false"
    if [[ $audit == on ]]; then echo "[audit]"; echo "dir = \"$DIR/audit\""; fi
  } > "$DIR/tiergate.toml"
  start_tiergate "$DIR/tiergate.toml" "$PORT" "$ADMIN" "$DIR/tiergate.log" "$BIN"
  PID=$SERVER
}
stop_server() {
  kill -TERM "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
  PID=""
}
trap '[[ -n "$PID" ]] && kill "$PID" 2>/dev/null; true' EXIT

MAX="${AUDIT_MAX:-}"
if [[ -z "$MAX" ]]; then
  log "sweep with the audit trail off: $SWEEP /s"
  start_server off
  "$OPENLOOP" --url "http://127.0.0.1:$PORT/v1/classify" --data "$DATA" --rates "$SWEEP" \
    --duration 5 --warmup 1.5 --label sweep --json "$OUT/sweep.jsonl" --stop-on-saturation >&2 || true
  stop_server
  MAX=$(python3 -c '
import json, sys
rates = [j["offered_rps"] for j in map(json.loads, open(sys.argv[1])) if j["sustained"]]
print(int(max(rates)) if rates else 0)' "$OUT/sweep.jsonl")
  [[ "$MAX" -gt 0 ]] || { log "no sustained rate in the sweep ($OUT/sweep.jsonl)"; exit 1; }
fi
RATE=$(python3 -c "print(round($MAX * $LOAD))")
log "maximum sustained short rate $MAX/s; measuring at $RATE/s, $REPEATS x (off, on)"

for i in $(seq 1 "$REPEATS"); do
  for audit in off on; do
    start_server "$audit"
    "$OPENLOOP" --url "http://127.0.0.1:$PORT/v1/classify" --data "$DATA" --rate "$RATE" \
      --duration "$DURATION" --warmup 2 --label "audit-$audit-$i" --pid "$PID" --json "$OUT/results.jsonl" >&2
    answered=$(curl -s "http://127.0.0.1:$ADMIN/metrics" | python3 -c '
import re, sys
# Both listeners count into it: less the one /readyz 200 that start_server waited for.
print(sum(int(float(m.group(1))) for m in re.finditer(r"^tiergate_http_responses_total\{[^}]*status=\"200\"[^}]*\} (\S+)", sys.stdin.read(), re.M)) - 1)')
    stop_server
    if [[ $audit == on ]]; then
      python3 - "$DIR/audit/audit.db" "$answered" "audit-$audit-$i" >> "$OUT/records.jsonl" <<'PY'
import json, sqlite3, sys
db, answered, label = sys.argv[1], int(sys.argv[2]), sys.argv[3]
c = sqlite3.connect(db)
total, distinct = c.execute("select count(*), count(distinct request_id) from records").fetchone()
classify = c.execute("select count(*) from records where kind = 'classify'").fetchone()[0]
print(json.dumps({"label": label, "answered_200": answered, "records": total, "distinct_request_ids": distinct, "classify_records": classify}))
PY
    fi
  done
done

python3 - "$OUT" "$MAX" "$RATE" <<'PY' | tee "$OUT/report.md"
import json, statistics, sys
out, top, rate = sys.argv[1], sys.argv[2], sys.argv[3]
runs = [json.loads(l) for l in open(f"{out}/results.jsonl")]
recs = {r["label"]: r for r in map(json.loads, open(f"{out}/records.jsonl"))}
print(f"Audit trail cost at {rate}/s (0.8 x the maximum sustained short rate {top}/s), short texts, one run:\n")
def thread(r, name):
    return (r.get("server_cpu_ms_per_req_by_thread") or {}).get(name, 0.0)
for r in runs:
    r["writer_ms"], r["runtime_ms"] = thread(r, "tiergate-audit"), thread(r, "tokio-rt-worker")
print("| run | offered/s | goodput/s | p50 ms | p99 ms | server CPU ms/req | of it: writer | of it: runtime | answered 200 | records | distinct ids |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in runs:
    rec = recs.get(r["label"], {})
    print(f"| {r['label']} | {r['offered_rps']:.0f} | {r['goodput_rps']:.1f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
          f"{r['server_cpu_ms_per_req']} | {r['writer_ms']:.3f} | {r['runtime_ms']:.3f} | "
          f"{rec.get('answered_200', '-')} | {rec.get('records', '-')} | {rec.get('distinct_request_ids', '-')} |")
def med(on, key):
    return statistics.median(r[key] for r in runs if r["label"].startswith(f"audit-{on}-"))
cpu_off, cpu_on = med("off", "server_cpu_ms_per_req"), med("on", "server_cpu_ms_per_req")
p99_off, p99_on = med("off", "p99_ms"), med("on", "p99_ms")
print(f"\nmedians: goodput off {med('off', 'goodput_rps'):.1f} / on {med('on', 'goodput_rps'):.1f} /s; "
      f"p99 off {p99_off:.2f} / on {p99_on:.2f} ms ({p99_on - p99_off:+.2f}); "
      f"CPU per request off {cpu_off:.3f} / on {cpu_on:.3f} ms: throughput cost {100 * (cpu_on / cpu_off - 1):+.1f} %")
writer, runtime = med("on", "writer_ms"), med("on", "runtime_ms") - med("off", "runtime_ms")
print(f"by thread: writer {writer:.3f} ms/req, runtime {runtime:+.3f} ms/req: "
      f"{100 * (writer + runtime) / cpu_off:+.1f} % of the trail-off CPU per request")
exact = all(r["records"] == r["distinct_request_ids"] == r["classify_records"] == r["answered_200"] for r in recs.values())
print("every answered request has exactly one record: " + ("yes" if exact else "NO"))
PY
