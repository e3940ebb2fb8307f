#!/usr/bin/env bash
# Builds the bench target NAME (`cargo bench --bench NAME --no-run`) and prints its executable's
# path, as cargo reports it (the file name carries a hash). The benches' scripts use it for the
# load generator (`openloop`) and the ceiling bench.
#
#   OPENLOOP="$(benches/bench_bin.sh openloop)"
set -euo pipefail
name="${1:?usage: benches/bench_bin.sh NAME}"
cd "$(dirname "$0")/.."
path="$(cargo bench --bench "$name" --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$name" | tail -1 || true)"
[[ -x "$path" ]] || { echo "bench_bin.sh: the $name bench was not built (cargo bench --bench $name --no-run)" >&2; exit 1; }
echo "$path"
