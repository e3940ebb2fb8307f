#!/usr/bin/env bash
# What feedback costs the request path (issue 29): `/v1/classify` p50/p99 and the server's CPU
# per request with and without labels arriving beside the traffic.
#
# 1. builds tiergate and the open-loop load generator (benches/openloop.rs);
# 2. runs FEEDBACK_REPEATS (3) rounds of two modes in turn (quiet, labels, quiet, ...), a fresh
#    server and audit store each time (the audit trail on in both: labels join its records),
#    FEEDBACK_RPS (100) requests/s of tests/data/ood_short.jsonl for FEEDBACK_DURATION (10)
#    measured seconds after 2 s of warm-up;
# 3. in the `labels` mode a feeder posts FEEDBACK_LABELS_RPS (50) labels/s to the admin
#    listener's `POST /v1/feedback`, one per request as an analyst's console does, for record ids
#    it reads once a second from the live audit store through a read-only SQLite connection (as
#    `tiergate report` does), over one keep-alive connection: mostly recent decisions, one in
#    five a repeat or a relabel; its own CPU is reported beside the server's (same 2 cores);
# 4. prints one table and the medians (also target/feedback_cost/<time>/report.md) and, per run
#    with labels, the feeder's count of answers by status and the labels in the store after
#    the server stopped (so a label that was answered but not kept would show).
#
# At a rate below saturation both modes answer everything, so the cost shows as CPU per
# request and in the latency percentiles. The label's own CPU (parse, look-up, the writer's
# insert) is counted in the server's CPU per /v1/classify request: that is the point — it is
# work the request path's cores do.
#
#   benches/feedback_cost.sh                                     # about 2 minutes after the build
#   FEEDBACK_RPS=200 FEEDBACK_LABELS_RPS=200 FEEDBACK_REPEATS=5 benches/feedback_cost.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
. benches/lib.sh
OUT="$ROOT/target/feedback_cost/$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$OUT"
RATE="${FEEDBACK_RPS:-100}"
LABELS="${FEEDBACK_LABELS_RPS:-50}"
REPEATS="${FEEDBACK_REPEATS:-3}"
DURATION="${FEEDBACK_DURATION:-10}"
DATA="$ROOT/tests/data/ood_short.jsonl"
log() { echo "[feedback_cost $(date +%H:%M:%S)] $*" >&2; }

log "building"
cargo build --release --bin tiergate >&2
OPENLOOP="$(benches/bench_bin.sh openloop)"
BIN="$ROOT/target/release/tiergate"

PID=""
FEEDER=""
start_server() {  # sets PORT ADMIN PID DIR
  PORT=$(free_port); ADMIN=$(free_port); DIR="$OUT/run-$1"
  mkdir -p "$DIR"
  {
    echo "[server]"; echo "listen = \"127.0.0.1:$PORT\""
    echo "[admin]"; echo "listen = \"127.0.0.1:$ADMIN\""
    echo "[model]"; echo "dir = \"$ROOT/models\""
    echo "[policies]"; echo "dir = \"$ROOT/policies\""; echo "watch = false"
    echo "[audit]"; echo "dir = \"$DIR/audit\""
  } > "$DIR/tiergate.toml"
  start_tiergate "$DIR/tiergate.toml" "$PORT" "$ADMIN" "$DIR/tiergate.log" "$BIN"
  PID=$SERVER
}
stop_server() {
  kill -TERM "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
  PID=""
}
# feeder SECONDS: post LABELS labels/s to the admin listener for SECONDS, then print its counts.
feeder() {
  python3 - "$DIR/audit/audit.db" "http://127.0.0.1:$ADMIN/v1/feedback" "$LABELS" "$1" <<'PY'
import collections, http.client, json, random, resource, sqlite3, sys, time, urllib.parse
db, url, rate, seconds = sys.argv[1], urllib.parse.urlsplit(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
random.seed(29)
# One keep-alive connection, as a review tool or an import would hold; the recent record ids
# read once a second, so that the feeder's own CPU stays small beside the server's.
http_conn = http.client.HTTPConnection(url.hostname, url.port, timeout=5)
conn, recent, read_at = None, [], 0.0
statuses, sent, labelled = collections.Counter(), 0, []
start = time.monotonic()
while time.monotonic() - start < seconds:
    due = start + sent / rate
    time.sleep(max(0.0, due - time.monotonic()))
    if time.monotonic() - read_at >= 1.0:
        read_at = time.monotonic()
        try:
            if conn is None:
                conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
            recent = [r[0] for r in conn.execute(
                "SELECT record_id FROM records WHERE record_id IS NOT NULL ORDER BY id DESC LIMIT 100")]
        except sqlite3.Error:
            pass  # the store is not there until the first flush
    if labelled and (not recent or random.random() < 0.2):
        record_id = random.choice(labelled)  # a repeat (duplicate) or a relabel (updated)
    elif recent:
        record_id = random.choice(recent)
        labelled.append(record_id)
    else:
        sent += 1
        statuses["no record yet"] += 1
        continue
    body = json.dumps({"record_id": record_id, "label": random.choice(["risk", "ok"]),
                       "source": "analyst", "reviewer": f"analyst-{sent % 7}"})
    http_conn.request("POST", url.path, body, {"content-type": "application/json"})
    resp = http_conn.getresponse()
    answer = resp.read()
    outcome = json.loads(answer)["results"][0]["outcome"] if resp.status == 200 else ""
    statuses[f"{resp.status} {outcome}".strip()] += 1
    sent += 1
cpu = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"sent": sent, "answers": dict(statuses), "distinct_records": len(set(labelled)),
                  "feeder_cpu_s": round(cpu.ru_utime + cpu.ru_stime, 2)}))
PY
}
trap '[[ -n "$PID" ]] && kill "$PID" 2>/dev/null; [[ -n "$FEEDER" ]] && kill "$FEEDER" 2>/dev/null; true' EXIT

for i in $(seq 1 "$REPEATS"); do
  for mode in quiet labels; do
    start_server "$mode-$i"
    if [[ $mode == labels ]]; then
      feeder "$((DURATION + 2))" > "$DIR/feeder.json" &
      FEEDER=$!
    fi
    "$OPENLOOP" --url "http://127.0.0.1:$PORT/v1/classify" --data "$DATA" --rate "$RATE" \
      --duration "$DURATION" --warmup 2 --label "feedback-$mode-$i" --pid "$PID" --json "$OUT/results.jsonl" >&2
    if [[ $mode == labels ]]; then
      wait "$FEEDER"; FEEDER=""
    fi
    stop_server
    if [[ $mode == labels ]]; then
      python3 - "$DIR" "feedback-$mode-$i" >> "$OUT/labels.jsonl" <<'PY'
import json, sqlite3, sys
run, label = sys.argv[1], sys.argv[2]
fed = json.load(open(f"{run}/feeder.json"))
kept = sqlite3.connect(f"file:{run}/audit/audit.db?mode=ro", uri=True).execute(
    "SELECT count(*) FROM feedback").fetchone()[0]
print(json.dumps({"label": label, **fed, "labels_in_store": kept}))
PY
    fi
  done
done

python3 - "$OUT" "$RATE" "$LABELS" <<'PY' | tee "$OUT/report.md"
import json, statistics, sys
out, rate, labels = sys.argv[1], sys.argv[2], sys.argv[3]
runs = [json.loads(l) for l in open(f"{out}/results.jsonl")]
fed = {r["label"]: r for r in map(json.loads, open(f"{out}/labels.jsonl"))}
print(f"Feedback cost at {rate} requests/s of short texts, with and without {labels} labels/s to"
      " POST /v1/feedback (audit trail on in both):\n")
print("| run | offered/s | goodput/s | p50 ms | p99 ms | server CPU ms/req | labels sent | answers | labels kept | feeder CPU s |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in runs:
    f = fed.get(r["label"], {})
    answers = ", ".join(f"{k}: {v}" for k, v in sorted(f.get("answers", {}).items())) or "-"
    print(f"| {r['label']} | {r['offered_rps']:.0f} | {r['goodput_rps']:.1f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
          f"{r['server_cpu_ms_per_req']} | {f.get('sent', '-')} | {answers} | {f.get('labels_in_store', '-')} | "
          f"{f.get('feeder_cpu_s', '-')} |")
def values(mode, key):
    return [r[key] for r in runs if r["label"].startswith(f"feedback-{mode}-")]
print("\n| mode | p50 ms (median) | p99 ms (median) | p99 ms range | CPU ms/req (median) | CPU range |")
print("|---|---|---|---|---|---|")
for mode in ["quiet", "labels"]:
    p99, cpu = values(mode, "p99_ms"), values(mode, "server_cpu_ms_per_req")
    print(f"| {mode} | {statistics.median(values(mode, 'p50_ms')):.2f} | {statistics.median(p99):.2f} | "
          f"{min(p99):.2f}-{max(p99):.2f} | {statistics.median(cpu):.3f} | {min(cpu):.3f}-{max(cpu):.3f} |")
quiet, fedp99 = values("quiet", "p99_ms"), values("labels", "p99_ms")
within = statistics.median(fedp99) <= max(quiet)
print(f"\np99 with labels (median {statistics.median(fedp99):.2f} ms) within the quiet runs' noise, i.e. not "
      f"above their range ({min(quiet):.2f}-{max(quiet):.2f} ms): {'yes' if within else 'NO'}")
PY
