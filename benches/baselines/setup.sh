#!/usr/bin/env bash
# Creates benches/baselines/.venv (gitignored) with the pinned Python baseline from PyPI.
# Idempotent: does nothing when the venv already matches requirements.txt.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
echo "$want" > "$stamp"
echo "baseline venv ready: $venv"
