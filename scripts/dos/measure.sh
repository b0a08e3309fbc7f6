#!/usr/bin/env bash
# Runs the second security review's N4, N7 and N9 attacks (the adapted scripts beside this one)
# against one `palisade` binary and prints what they measure: the server's RSS under h2mem.py,
# an honest holder's fenced-write latency under bodyhog.py, when h2hold.py's connections end.
# Each part starts its own servers on a fresh temporary directory and free loopback ports.
#
#   scripts/dos/measure.sh PALISADE_BIN [h2mem] [bodyhog] [h2hold] [h2cap]
#   (default: all four)
#
# Needs python3; the `h2` package comes from PyPI into scripts/dos/.venv on first use. Prints
# the load average with each part.
# h2cap needs a non-loopback IPv4 address on the host.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$(realpath "$1")"; shift
parts="${*:-h2mem bodyhog h2hold h2cap}"
# The attacks speak HTTP/2 frame by frame with the `h2` package, in a virtualenv of their own.
if [ ! -x "$here/.venv/bin/python3" ] || ! "$here/.venv/bin/python3" -c 'import h2' 2>/dev/null; then
  python3 -m venv "$here/.venv" && "$here/.venv/bin/pip" install -q h2
fi
export PATH="$here/.venv/bin:$PATH"
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for_port() {
  for _ in $(seq 1 150); do
    if (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "measure: nothing listens on $1:$2" >&2; exit 1
}
load() { cut -d' ' -f1-3 /proc/loadavg; }
# $1: the RSS samples, $2 and $3: a window in Unix seconds; prints the peak MiB in it.
peak() { awk -v a="$2" -v b="$3" '$1>=a && $1<=b && $2>m {m=$2} END {print m}' "$1"; }
last() { tail -1 "$1" | cut -d' ' -f2; }

h2mem() {
  local port; port=$(free_port)
  RUST_LOG=warn "$bin" serve --data-dir "$work/h2mem" --listen "127.0.0.1:$port" >"$work/h2mem.log" 2>&1 &
  local pid=$!; pids+=("$pid")
  wait_for_port 127.0.0.1 "$port"; sleep 2
  python3 "$here/rss.py" "$pid" 0.2 >"$work/rss" & pids+=($!)
  sleep 1
  echo "== h2mem (load average: $(load)); idle RSS $(last "$work/rss") MiB"
  local n t0 t1 attackers
  for n in 1 3 20; do
    attackers=()
    t0=$(date +%s.%N)
    for _ in $(seq "$n"); do python3 "$here/h2mem.py" 127.0.0.1 "$port" 1000 60000 15 >>"$work/h2mem.out" & attackers+=($!); done
    wait "${attackers[@]}" || true
    t1=$(date +%s.%N); sleep 5
    echo "   $n connection(s) at once: peak $(peak "$work/rss" "$t0" "$t1") MiB, 5 s after they closed $(last "$work/rss") MiB (load average: $(load))"
    sed -E "s/ in [0-9.]+s/ in N s/; s/held [0-9.]+s/held N s/" "$work/h2mem.out" | sort | uniq -c | sed 's/^/      /'; rm "$work/h2mem.out"
  done
  kill "$pid"
}

bodyhog() {
  local port sport; port=$(free_port); sport=$(free_port)
  RUST_LOG=warn "$bin" serve --data-dir "$work/bh" --listen "127.0.0.1:$port" >"$work/bh.log" 2>&1 &
  local pid=$!; pids+=("$pid")
  wait_for_port 127.0.0.1 "$port"
  export PALISADE_ENDPOINT="http://127.0.0.1:$port"
  local key; key=$("$bin" pubkey 2>/dev/null)
  RUST_LOG=warn "$bin" store serve --public-key "$key" --data-dir "$work/store" \
    --listen "127.0.0.1:$sport" >"$work/store.log" 2>&1 &
  local spid=$!; pids+=("$spid")
  wait_for_port 127.0.0.1 "$sport"
  local n mode seconds
  for run in "0 cl 20" "8 cl 60" "8 chunked 60" "8 put 60"; do
    read -r n mode seconds <<<"$run"
    echo "== bodyhog: $n sockets, $mode, ${seconds} s (load average: $(load))"
    "$bin" lock jobs/bodyhog -- python3 "$here/bodyhog.py" 127.0.0.1 "$sport" "$n" "$mode" "$bin" "$seconds"
  done
  kill "$spid" "$pid"
}

h2hold() {
  local port; port=$(free_port)
  RUST_LOG=warn "$bin" serve --data-dir "$work/hold" --listen "127.0.0.1:$port" >"$work/hold.log" 2>&1 &
  local pid=$!; pids+=("$pid")
  wait_for_port 127.0.0.1 "$port"
  echo "== h2hold: 3 connections from loopback, 150 s (load average: $(load))"
  python3 "$here/h2hold.py" 127.0.0.1 "$port" 150 3
  kill "$pid"
}

# N9's per-address cap: loopback is exempt by default, so this listens on the first non-loopback
# IPv4 address of the host (the connections then come from it) and opens 300 connections.
h2cap() {
  local port addr; port=$(free_port)
  addr=$(ip -4 -o addr show scope global | awk '{split($4, a, "/"); print a[1]; exit}')
  RUST_LOG=warn "$bin" serve --data-dir "$work/cap" --listen "$addr:$port" --insecure-listen-any \
    >"$work/cap.log" 2>&1 &
  local pid=$!; pids+=("$pid")
  wait_for_port "$addr" "$port"
  echo "== h2hold: 300 connections from $addr, 20 s (load average: $(load))"
  python3 "$here/h2hold.py" "$addr" "$port" 20 300
  kill "$pid"
}

for part in $parts; do "$part"; done
