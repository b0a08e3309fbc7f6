#!/usr/bin/env bash
# Fails if clients/go/palisadev1 or clients/go/fence/redis/redis.lua is not what
# scripts/generate.sh makes from the current .proto and fence script (regenerated into a
# temporary directory and compared file by file).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$here/scripts/generate.sh" "$tmp"
if ! { diff -r "$here/palisadev1" "$tmp/palisadev1" && diff "$here/fence/redis/redis.lua" "$tmp/fence/redis/redis.lua"; } >"$tmp.diff" 2>&1; then
  cat "$tmp.diff" >&2
  rm -f "$tmp.diff"
  echo "check-generated: clients/go/palisadev1 or fence/redis/redis.lua is stale; run clients/go/scripts/generate.sh and commit the result" >&2
  exit 1
fi
rm -f "$tmp.diff"
echo "check-generated: clients/go/palisadev1 and fence/redis/redis.lua match the .proto and crates/fence/src/redis.lua"
