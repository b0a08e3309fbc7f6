#!/usr/bin/env bash
# Runs every `palisade bench` workload against Palisade and against etcd 3.4 on this machine and
# prints a markdown table with both columns and their ratio (the targets are in
# docs/benchmarks.md, "Targets").
#
#   scripts/bench-vs-etcd.sh [--duration 5s] [--warmup 1s] [--json FILE]
#
# Installs etcd (Debian package etcd-server) if it is missing, builds palisade in release mode,
# starts etcd, `palisade serve` and `palisade store serve` on temporary directories and free
# loopback ports (all durable, fsync on), and stops them all on exit, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."

duration=5s
warmup=1s
json_out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --json) json_out="$2"; shift 2 ;;
    *) echo "usage: $0 [--duration D] [--warmup D] [--json FILE]" >&2; exit 2 ;;
  esac
done

log() { echo "bench-vs-etcd: $*" >&2; }

# --- etcd ----------------------------------------------------------------------------------
if ! command -v etcd >/dev/null; then
  log "installing etcd (Debian package etcd-server)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq etcd-server >/dev/null 2>&1 || {
    apt-get update -qq && apt-get install -y -qq etcd-server >/dev/null
  }
fi
log "$(etcd --version | head -1)"

# --- palisade --------------------------------------------------------------------------------
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
log "building palisade (release)"
cargo build --release -q -p palisade-cli
palisade="$CARGO_TARGET_DIR/release/palisade"

# --- services --------------------------------------------------------------------------------
work="$(mktemp -d -t palisade-bench-vs-etcd.XXXXXX)"
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    # Give each a few seconds to stop, then insist.
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
wait_for_port() { # port name
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  log "$2 did not start listening on 127.0.0.1:$1; its log:"
  tail -20 "$work/$2.log" >&2 || true
  exit 1
}

etcd_port=$(free_port)
etcd_peer_port=$(free_port)
log "starting etcd on 127.0.0.1:$etcd_port (data in $work/etcd)"
etcd --name bench --data-dir "$work/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" \
  --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster "bench=http://127.0.0.1:$etcd_peer_port" \
  --log-level error >"$work/etcd.log" 2>&1 &
pids+=($!)
wait_for_port "$etcd_port" etcd

lock_port=$(free_port)
metrics_port=$(free_port)
log "starting palisade serve on 127.0.0.1:$lock_port (data in $work/palisade)"
RUST_LOG=warn "$palisade" serve --data-dir "$work/palisade" --listen "127.0.0.1:$lock_port" \
  --metrics-listen "127.0.0.1:$metrics_port" >"$work/palisade.log" 2>&1 &
palisade_pid=$!
pids+=($palisade_pid)
wait_for_port "$lock_port" palisade

public_key="$(PALISADE_ENDPOINT="http://127.0.0.1:$lock_port" "$palisade" pubkey)"
store_port=$(free_port)
log "starting palisade store serve on 127.0.0.1:$store_port (data in $work/store)"
RUST_LOG=warn "$palisade" store serve --data-dir "$work/store" --listen "127.0.0.1:$store_port" \
  --public-key "$public_key" >"$work/store.log" 2>&1 &
pids+=($!)
wait_for_port "$store_port" store

# --- the benchmark ----------------------------------------------------------------------------
log "running every workload on both (each ${duration} after ${warmup} warm-up)"
args=(bench all --target "palisade://127.0.0.1:$lock_port" --target "etcd://127.0.0.1:$etcd_port"
  --store "127.0.0.1:$store_port" --store-dir "$work" --duration "$duration" --warmup "$warmup"
  --metrics "http://127.0.0.1:$metrics_port/metrics" --server-pid "$palisade_pid")
if [ -n "$json_out" ]; then args+=(--json-file "$json_out"); fi
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GiB RAM; $(etcd --version | head -1)"
echo "load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "What this machine allows, measured on its primitives (\`palisade bench floor\`):"
echo
"$palisade" bench floor --store-dir "$work"
echo
"$palisade" "${args[@]}" --markdown

