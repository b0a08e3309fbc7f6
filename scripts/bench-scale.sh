#!/usr/bin/env bash
# Runs `palisade bench scale` against Palisade and etcd on this machine and prints its markdown
# table: sessions 1k → 10k → 100k, held locks 10k → 100k → 1M, 10k waiters on one lock, 10k
# watchers, with latency, RSS, listing, snapshot and restart at each step, and the goals of
# issue #12 marked met or not.
#
#   scripts/bench-scale.sh [--time-limit 30m] [--json FILE] [--no-etcd] [-- MORE BENCH FLAGS]
#
# Installs etcd (Debian packages etcd-server, etcd-client) if it is missing, builds palisade in
# release mode; `palisade bench scale` starts and stops both servers itself (durable, on
# temporary directories and free loopback ports). Flags after `--` go to `palisade bench scale`,
# e.g. `-- --locks 10000,100000 --sessions 1000`.
set -euo pipefail
cd "$(dirname "$0")/.."

time_limit=30m
json_out=""
etcd=1
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --time-limit) time_limit="$2"; shift 2 ;;
    --json) json_out="$2"; shift 2 ;;
    --no-etcd) etcd=0; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--time-limit D] [--json FILE] [--no-etcd] [-- FLAGS]" >&2; exit 2 ;;
  esac
done

log() { echo "bench-scale: $*" >&2; }

args=(bench scale --time-limit "$time_limit")
if [ "$etcd" = 1 ]; then
  if ! command -v etcd >/dev/null; then
    log "installing etcd (Debian packages etcd-server, etcd-client)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq etcd-server etcd-client >/dev/null 2>&1 || {
      apt-get update -qq && apt-get install -y -qq etcd-server etcd-client >/dev/null
    }
  fi
  log "$(etcd --version | head -1)"
  args+=(--etcd-bin "$(command -v etcd)")
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
log "building palisade (release)"
cargo build --release -q -p palisade-cli
palisade="$CARGO_TARGET_DIR/release/palisade"

if [ -n "$json_out" ]; then args+=(--json-file "$json_out"); fi
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GiB RAM"
echo "load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
"$palisade" "${args[@]}" "${extra[@]}"
