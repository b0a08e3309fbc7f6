#!/usr/bin/env bash
# Measures what authentication and authorization cost: runs the lock workloads of
# `palisade bench` against a `palisade serve` without tokens or a policy, then against one with
# `--tokens` and `--policy` (a bench identity granted `lock,read` on `*`, its quotas raised to
# the caps), each on a fresh temporary directory and a free loopback port, and prints both
# reports. The clients of the second run send the bearer token (PALISADE_AUTH_TOKEN).
#
#   scripts/bench-auth.sh [--duration 5s] [--warmup 1s] [--workloads "latency uncontended contended"]
#
# PALISADE_BIN picks the binary (default: target/release/palisade, built). The load average is
# printed before each run: the machine may be shared. Each report gives the server's CPU time
# (--server-pid), steadier than the rates when other work shares the CPUs.
set -euo pipefail
cd "$(dirname "$0")/.."

duration=5s
warmup=1s
workloads="latency uncontended contended"
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --workloads) workloads="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

palisade="${PALISADE_BIN:-target/release/palisade}"
if [ -z "${PALISADE_BIN:-}" ]; then cargo build --release -q -p palisade-cli; fi

work="$(mktemp -d)"
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for_port() {
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "bench-auth: palisade serve did not start" >&2; exit 1
}

# $1: a name for the run; the rest: extra flags of `palisade serve`.
run() {
  local name="$1"; shift
  local port; port=$(free_port)
  RUST_LOG=warn "$palisade" serve --data-dir "$work/$name" --listen "127.0.0.1:$port" "$@" \
    >"$work/$name.log" 2>&1 &
  pid=$!
  wait_for_port "$port"
  for workload in $workloads; do
    echo "== $name: $workload (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
    "$palisade" bench "$workload" --target "palisade://127.0.0.1:$port" \
      --duration "$duration" --warmup "$warmup" --server-pid "$pid"
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
}

unset PALISADE_AUTH_TOKEN
run open

{ read -r token; read -r line; } < <("$palisade" token new bench 2>/dev/null)
echo "$line" >"$work/tokens"
cat >"$work/policy" <<POLICY
grant bench lock,read *
quota bench sessions=50000 locks=1000000 waiters=20000 watches=20000
POLICY
export PALISADE_AUTH_TOKEN="$token"
run secured --tokens "$work/tokens" --policy "$work/policy"
