#!/usr/bin/env bash
# Checks and unit-tests the alert rules: `promtool check rules alerts.yml` and
# `promtool test rules alerts_test.yml` (or the test files given as arguments: tests/drift.rs
# passes one built from the drift gauges it measured). promtool comes from Debian's `prometheus` package,
# unpacked (not installed) into ~/.cache/tiergate/promtool on first use with
# `apt-get download` (needs apt and network once); set PROMTOOL to use another promtool.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/tiergate/promtool"
promtool="${PROMTOOL:-$cache/usr/bin/promtool}"

if [ ! -x "$promtool" ]; then
  command -v apt-get >/dev/null || { echo "promtool not found and no apt-get to fetch it: set PROMTOOL" >&2; exit 1; }
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "fetching promtool (Debian package prometheus) into $cache" >&2
  # apt-get download writes into the current directory; it needs the package lists
  # (apt-get update) on a fresh machine.
  (cd "$tmp" && { apt-get download prometheus >/dev/null 2>&1 \
      || { apt-get update >/dev/null && apt-get download prometheus >/dev/null; }; })
  mkdir -p "$cache"
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
  mkdir -p "$cache/usr/bin"
  cp "$tmp/x/usr/bin/promtool" "$cache/usr/bin/promtool"
fi

"$promtool" --version | head -1
cd "$here"
"$promtool" check rules alerts.yml
if [ "$#" -gt 0 ]; then
  "$promtool" test rules "$@"
else
  "$promtool" test rules alerts_test.yml
fi
