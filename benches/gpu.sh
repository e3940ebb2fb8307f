#!/usr/bin/env bash
# The gpu tier on a real GPU, one command:  benches/gpu.sh
#
# On a machine with an NVIDIA GPU (nvidia-smi answers) it
# 1. fetches the CUDA build of ONNX Runtime from PyPI (onnxruntime-gpu, with its CUDA and cuDNN
#    wheels) into a venv under ~/.cache/tiergate/gpu-venv, and builds tiergate and the load generator;
# 2. starts tiergate with the in-process gpu tier (`[gpu] backend = "onnx"`, CUDA execution
#    provider, the bundled model) and a policy that starts every request on the gpu tier;
# 3. checks that /readyz reports the device and its free memory (cudarc / CUDA driver);
# 4. sends requests open-loop at rising rates and prints, per rate, the gpu tier's p50 / p99
#    (the path's gpu step), how many requests the gpu tier answered, and the free GPU memory
#    tiergate saw (headroom) before and after.
# Without a GPU it says so and exits 0. Output: target/gpu/<timestamp>/ (report.txt, logs).
#
# Not covered, and why: a CUDA build of the llama.cpp server ships in no registry package this
# project can reach (PyPI xllamacpp and llama-cpp-python publish CPU wheels there; their CUDA
# wheels live on their own indexes), so the upstream backend on a GPU is left to a machine that
# has a model server; ONNX Runtime's CUDA graphs need fixed input shapes, and tiergate pads each
# batch to its own longest sequence, so they are not tried.
# Knobs (env): GPU_RATES (default 50,200,500), GPU_DURATION (s per rate, 5), ORT_GPU_VERSION (1.32.0).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
    echo "benches/gpu.sh: no NVIDIA GPU on this machine (nvidia-smi missing or failing): nothing to measure"
    exit 0
fi
OUT="$ROOT/target/gpu/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$OUT"
RATES="${GPU_RATES:-50,200,500}"
DURATION="${GPU_DURATION:-5}"
ORT_GPU_VERSION="${ORT_GPU_VERSION:-1.32.0}"
PORT=18480
log() { echo "[gpu $(date +%T)] $*" | tee -a "$OUT/gpu.log" >&2; }
nvidia-smi -L | tee "$OUT/devices.txt"

# ---- 1. ONNX Runtime with CUDA (PyPI), tiergate, the load generator ------------------------
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/tiergate/gpu-venv"
if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
fi
"$VENV/bin/pip" install -q "onnxruntime-gpu[cuda,cudnn]==$ORT_GPU_VERSION" || {
    log "onnxruntime-gpu $ORT_GPU_VERSION with its CUDA/cuDNN extras did not install; set ORT_GPU_VERSION"; exit 1; }
SITE="$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
export ORT_DYLIB_PATH="$(ls "$SITE"/onnxruntime/capi/libonnxruntime.so.* | head -1)"
# the CUDA / cuDNN / cuBLAS libraries the wheels brought
LD_LIBRARY_PATH="$(find "$SITE/nvidia" -maxdepth 2 -name lib -type d 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}"
export LD_LIBRARY_PATH
log "ONNX Runtime: $ORT_DYLIB_PATH"
cargo build --release --quiet
OPENLOOP="$(benches/bench_bin.sh openloop)"

# ---- 2. tiergate with the in-process gpu tier ----------------------------------------------
sed -e '/^\[gpu\]/,/^\[/ s/^backend = "none"/backend = "onnx"/' config/tiergate.toml > "$OUT/tiergate.toml"
cp -r policies "$OUT/policies"
# every request starts on the gpu tier while it is eligible
sed -i -e 's/^cpu_max_complexity = .*/cpu_max_complexity = 0.0/' "$OUT/policies/routing.toml"
target/release/tiergate serve --config "$OUT/tiergate.toml" --models "$ROOT/models" --policies "$OUT/policies" \
    --listen 127.0.0.1:$PORT --admin-listen 127.0.0.1:$((PORT + 1)) > "$OUT/tiergate.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 600); do
    curl -sf -o /dev/null "http://127.0.0.1:$PORT/readyz" && break
    kill -0 $SERVER 2>/dev/null || { log "tiergate died on start:"; tail -20 "$OUT/tiergate.log"; exit 1; }
    sleep 0.1
done

# ---- 3. /readyz: the device as tiergate sees it ----------------------------------------------
sleep 1  # one GPU sampling period (signals.gpu_interval_ms), so /readyz has a fresh reading
# /readyz details and /metrics are served on the admin listener ([admin] public_* are off).
curl -s "http://127.0.0.1:$((PORT + 1))/readyz" > "$OUT/readyz-before.json"
python3 - "$OUT/readyz-before.json" <<'EOF' | tee -a "$OUT/report.txt"
import json, sys
r = json.load(open(sys.argv[1]))
dev = r["devices"]
if dev.get("status") != "present" or not dev.get("gpus"):
    sys.exit(f"/readyz reports no GPU device ({dev}): tiergate's CUDA driver probe found none")
for g in dev["gpus"]:
    print(f"device {g['ordinal']}: {g['free_bytes'] >> 20} MiB free of {g['total_bytes'] >> 20} MiB (as tiergate sees it)")
print("gpu tier:", json.dumps(r["tiers"]["gpu"]))
EOF

# ---- 4. load, and the gpu tier's latency from the decisions' paths ---------------------------
probe() {  # one request, its path
    curl -s "http://127.0.0.1:$PORT/v1/classify" -H 'content-type: application/json' \
        -d '{"text":"Your account is locked. Confirm your password at http://secure-login.example.top/verify"}'
}
probe | tee "$OUT/probe.json" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("probe:", d["tier"], [(s["tier"], s["outcome"], s.get("latency_us")) for s in d["path"]])' | tee -a "$OUT/report.txt"
"$OPENLOOP" --url "http://127.0.0.1:$PORT/v1/classify" --rates "$RATES" --duration "$DURATION" --warmup 1 \
    --data tests/data/ood_short.jsonl --data tests/data/test_sample.jsonl --pid $SERVER \
    --degraded '"tier":"gpu","outcome":"skipped"' --degraded '"tier":"gpu","outcome":"error"' \
    --json "$OUT/load.jsonl" | tee -a "$OUT/report.txt"
curl -s "http://127.0.0.1:$((PORT + 1))/metrics" > "$OUT/metrics.txt"
curl -s "http://127.0.0.1:$((PORT + 1))/readyz" > "$OUT/readyz-after.json"
python3 - "$OUT/metrics.txt" <<'EOF' | tee -a "$OUT/report.txt"
import re, sys
# tiergate_tier_latency_seconds{tier="gpu"}: p50 / p99 from the histogram buckets
b = [(float(le), float(v)) for le, v in re.findall(r'tiergate_tier_latency_seconds_bucket\{tier="gpu",le="([^"]+)"\} (\S+)', open(sys.argv[1]).read()) if le != "+Inf"]
if not b or b[-1][1] == 0:
    sys.exit("the gpu tier answered nothing: see tiergate.log")
n = b[-1][1]
q = lambda p: next(le for le, c in b if c >= p * n)
print(f"gpu tier: {n:.0f} calls, p50 <= {q(0.5) * 1000:.2f} ms, p99 <= {q(0.99) * 1000:.2f} ms (histogram bucket bounds)")
for m in re.findall(r'tiergate_gpu_(?:free|total)_bytes\{[^}]*\} \S+', open(sys.argv[1]).read()):
    print(m)
EOF
log "report: $OUT/report.txt"
