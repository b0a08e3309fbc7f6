#!/usr/bin/env bash
# Context switches and CPU per lock operation of each thread of one `palisade serve`, while one
# client runs acquire+release cycles (`palisade bench latency`) against it: which thread wakes
# how often per operation. Measures that hold while the machine is shared (unlike timings).
#
#   scripts/thread-profile.sh [--server-bin PATH] [--bench-bin PATH] [--seconds N] [--label TEXT]
#                             [--wakeups] [--server-env NAME=VALUE]...
#
# A fresh single node on a temporary directory (fsync on), the bench's own warm-up, then a
# window of N seconds (default 4) inside its measured time. Per thread (from
# /proc/PID/task/TID/{comm,status,schedstat}): voluntary and involuntary switches and CPU time
# over the window, divided by the lock operations the server counted in the same window
# (palisade_grants_total + palisade_releases_total from its /metrics). Also the bench client's
# threads, and the log commits (fsyncs) per operation. With --wakeups (needs perf and its
# sched tracepoints), who woke which thread how often per operation: the chain of hand-offs.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
server_bin="${CARGO_TARGET_DIR:-$here/target}/release/palisade"
bench_bin=""
seconds=4
label=""
wakeups=0
server_env=()
while [ $# -gt 0 ]; do
  case "$1" in
    --server-bin) server_bin=$2; shift 2 ;;
    --bench-bin) bench_bin=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --label) label=$2; shift 2 ;;
    --wakeups) wakeups=1; shift ;;
    --server-env) server_env+=("$2"); shift 2 ;;
    *) echo "thread-profile: unknown argument $1" >&2; exit 2 ;;
  esac
done
bench_bin=${bench_bin:-$server_bin}
[ -x "$server_bin" ] || { echo "thread-profile: no server binary at $server_bin" >&2; exit 2; }

dir=$(mktemp -d /tmp/thread-profile.XXXXXX)
port=$((20000 + RANDOM % 20000))
mport=$((port + 1))
server_pid=""
bench_pid=""
cleanup() {
  [ -n "$bench_pid" ] && kill "$bench_pid" 2>/dev/null || true
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

env RUST_LOG=warn "${server_env[@]}" "$server_bin" serve --data-dir "$dir/data" --listen "127.0.0.1:$port" \
  --metrics-listen "127.0.0.1:$mport" >"$dir/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$mport/metrics" >/dev/null 2>&1 && break
  sleep 0.1
done

# The bench measures (after its warm-up) from before our window to after it.
"$bench_bin" bench latency --target "palisade://127.0.0.1:$port" --warmup 1s \
  --duration "$((seconds + 5))s" >"$dir/bench.out" 2>&1 &
bench_pid=$!
sleep 2

# TID COMM VOLUNTARY INVOLUNTARY RUN_NS for every thread of a process.
threads() {
  local pid=$1
  awk 'FNR == 1 { split(FILENAME, part, "/"); tid = part[5] }
    FILENAME ~ /status$/ && /^Name:/ { name[tid] = $2 }
    /^voluntary_ctxt_switches/ { vol[tid] = $2 }
    /^nonvoluntary_ctxt_switches/ { inv[tid] = $2 }
    FILENAME ~ /schedstat$/ { run[tid] = $1 }
    END { for (t in name) print t, name[t], vol[t], inv[t], run[t] }' \
    /proc/"$pid"/task/*/status /proc/"$pid"/task/*/schedstat 2>/dev/null || true
}
ops() {
  curl -sf "http://127.0.0.1:$mport/metrics" |
    awk '/^palisade_(grants|releases)_total/ {n += $NF} END {printf "%d\n", n}'
}
commits() {
  curl -sf "http://127.0.0.1:$mport/metrics" |
    awk '/^palisade_log_commit_duration_seconds_count/ {n += $NF} END {printf "%d\n", n}'
}

started=$(date +%s.%N)
ops0=$(ops); commits0=$(commits)
threads "$server_pid" >"$dir/s0"; threads "$bench_pid" >"$dir/b0"
if [ "$wakeups" = 1 ]; then
  # Every wake-up on the machine while perf runs (the waker is whatever ran: a thread, or the
  # idle task for a disk or network interrupt), kept below where a profiled thread is woken;
  # counted against the operations from just before perf's start to just after its end.
  perf_ops0=$(ops)
  perf record -q -a -e sched:sched_wakeup -o "$dir/perf.data" 2>/dev/null &
  perf_pid=$!
  sleep "$seconds"
  kill -INT "$perf_pid"
  wait "$perf_pid" 2>/dev/null || true
  perf_ops1=$(ops)
else
  sleep "$seconds"
fi
ops1=$(ops); commits1=$(commits)
window=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
threads "$server_pid" >"$dir/s1"; threads "$bench_pid" >"$dir/b1"
wait "$bench_pid" || { echo "thread-profile: the bench failed:" >&2; tail -5 "$dir/bench.out" >&2; }
bench_pid=""
n=$((ops1 - ops0))

report() { # name before after
  echo "$1 (per lock operation; $n operations in ${window}s)"
  printf '  %-18s %8s %8s %8s %9s\n' thread voluntary involunt total cpu_us
  join <(sort "$2") <(sort "$3") | awk -v n="$n" '
    { v = $7 - $3; i = $8 - $4; c = ($9 - $5) / 1000;
      if (v + i == 0 && c < 1) next;
      printf "  %-18s %8.2f %8.2f %8.2f %9.1f\n", $2 "/" $1, v / n, i / n, (v + i) / n, c / n;
      tv += v; ti += i; tc += c }
    END { printf "  %-18s %8.2f %8.2f %8.2f %9.1f\n", "all threads", tv / n, ti / n, (tv + ti) / n, tc / n }'
}
echo "thread-profile ${label:+($label) }server $server_bin; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "log commits per operation: $(awk -v c=$((commits1 - commits0)) -v n="$n" 'BEGIN {printf "%.2f", c / n}')"
report "server" "$dir/s0" "$dir/s1"
report "bench client" "$dir/b0" "$dir/b1"
if [ "$wakeups" = 1 ]; then
  echo "wake-ups per lock operation (waker -> woken thread; $((perf_ops1 - perf_ops0)) operations while perf ran)"
  names=$(cat "$dir/s1" "$dir/b1" | awk '{printf "%s%s=%s", sep, $1, $2; sep=","}')
  perf script -i "$dir/perf.data" -F tid,trace 2>/dev/null | awk -v n="$((perf_ops1 - perf_ops0))" -v names="$names" '
    BEGIN { k = split(names, a, ","); for (j = 1; j <= k; j++) { split(a[j], kv, "="); name[kv[1]] = kv[2] } }
    { match($0, /pid=[0-9]+/); wakee = substr($0, RSTART + 4, RLENGTH - 4);
      if (!(wakee in name)) next;
      waker = ($1 in name) ? name[$1] "/" $1 : "elsewhere";
      count[waker " -> " name[wakee] "/" wakee]++ }
    END { for (e in count) printf "  %6.2f  %s\n", count[e] / n, e }' | sort -rn | head -25
fi
grep -E "whole|acquire|release|cycles" "$dir/bench.out" | head -6 | sed 's/^/  bench: /'
