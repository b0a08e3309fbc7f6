#!/usr/bin/env bash
# Measures the fenced store: starts `palisade serve` and `palisade store serve` on temporary
# directories and free loopback ports, runs the store workloads of `palisade bench` against
# them (in this process and over HTTP), prints a markdown table per workload, and stops both.
#
#   scripts/bench-store.sh [--duration 5s] [--warmup 1s] [--workloads "fenced-write fenced-read txn"]
#                          [--json-dir DIR]
#
# - fenced-write: fenced vs unfenced writes in-process (the fencing cost), fenced writes over HTTP;
# - fenced-read:  fenced reads by the holder and by grants the store has not seen (they advance
#                 the lock's accepted token), against fenced writes of the same run;
# - txn:          revision compare + put under one sequencer check, against fenced puts.
#
# PALISADE_BIN picks the binary (default: target/release/palisade, built). With --json-dir, each
# workload's report is also written there as <workload>.json. The load average is printed before
# and after each workload: the machine may be shared.
set -euo pipefail
cd "$(dirname "$0")/.."

duration=5s
warmup=1s
workloads="fenced-write fenced-read txn"
json_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --workloads) workloads="$2"; shift 2 ;;
    --json-dir) json_dir="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

palisade="${PALISADE_BIN:-target/release/palisade}"
if [ -z "${PALISADE_BIN:-}" ]; then cargo build --release -q -p palisade-cli; fi

work="$(mktemp -d)"
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for_port() {
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "bench-store: $2 did not start" >&2; exit 1
}

lock_port=$(free_port)
RUST_LOG=warn "$palisade" serve --data-dir "$work/palisade" --listen "127.0.0.1:$lock_port" \
  --metrics-listen "127.0.0.1:$(free_port)" >"$work/palisade.log" 2>&1 &
pids+=($!)
wait_for_port "$lock_port" "palisade serve"
public_key="$(PALISADE_ENDPOINT="http://127.0.0.1:$lock_port" "$palisade" pubkey)"
store_port=$(free_port)
RUST_LOG=warn "$palisade" store serve --data-dir "$work/store" --listen "127.0.0.1:$store_port" \
  --public-key "$public_key" >"$work/store.log" 2>&1 &
pids+=($!)
wait_for_port "$store_port" "palisade store serve"

if [ -n "$json_dir" ]; then mkdir -p "$json_dir"; fi
for workload in $workloads; do
  echo "== $workload (load average before: $(cut -d' ' -f1-3 /proc/loadavg))"
  json=()
  if [ -n "$json_dir" ]; then json=(--json-file "$json_dir/$workload.json"); fi
  "$palisade" bench "$workload" --target "palisade://127.0.0.1:$lock_port" \
    --store "127.0.0.1:$store_port" --store-dir "$work" --duration "$duration" --warmup "$warmup" \
    --markdown "${json[@]}"
  echo "== $workload done (load average after: $(cut -d' ' -f1-3 /proc/loadavg))"
done
