#!/usr/bin/env bash
# Runs every `palisade bench` workload against Palisade and against etcd 3.4 on this machine and
# prints a markdown table with both columns and their ratio (the targets are in
# docs/benchmarks.md, "Targets").
#
#   scripts/bench-vs-etcd.sh [--nodes 1|3] [--duration 5s] [--warmup 1s] [--json FILE]
#
# Installs etcd (Debian packages etcd-server, etcd-client) if it is missing, builds palisade in
# release mode, starts etcd, `palisade serve` and `palisade store serve` on temporary directories
# and free loopback ports (all durable, fsync on), and stops them all on exit, whatever happens.
#
# --nodes 3 runs a 3-node Palisade cluster and a 3-member etcd cluster instead, aims the
# workloads at each one's leader, and then measures failover: `kill -9` of the leader until the
# next grant a client with every endpoint gets (3 rounds each, the killed node restarted in
# between).
set -euo pipefail
cd "$(dirname "$0")/.."

duration=5s
warmup=1s
json_out=""
nodes=1
failover_rounds=3
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --json) json_out="$2"; shift 2 ;;
    *) echo "usage: $0 [--nodes 1|3] [--duration D] [--warmup D] [--json FILE]" >&2; exit 2 ;;
  esac
done
case "$nodes" in 1|3) ;; *) echo "--nodes is 1 or 3" >&2; exit 2 ;; esac

log() { echo "bench-vs-etcd: $*" >&2; }

# --- etcd ----------------------------------------------------------------------------------
if ! command -v etcd >/dev/null || ! command -v etcdctl >/dev/null; then
  log "installing etcd (Debian packages etcd-server, etcd-client)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq etcd-server etcd-client >/dev/null 2>&1 || {
    apt-get update -qq && apt-get install -y -qq etcd-server etcd-client >/dev/null
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

# Member i of each system: etcd client and peer ports, palisade port, data directories.
declare -a etcd_client etcd_peer etcd_pid lock_port lock_pid metrics_port
etcd_cluster=""
palisade_cluster=""
for i in $(seq 1 "$nodes"); do
  etcd_client[$i]=$(free_port); etcd_peer[$i]=$(free_port); lock_port[$i]=$(free_port)
  metrics_port[$i]=$(free_port)
  etcd_cluster+="${etcd_cluster:+,}m$i=http://127.0.0.1:${etcd_peer[$i]}"
  palisade_cluster+="${palisade_cluster:+,}$i=127.0.0.1:${lock_port[$i]}"
done
lock_endpoints=$(for i in $(seq 1 "$nodes"); do echo "127.0.0.1:${lock_port[$i]}"; done | paste -sd,)
etcd_endpoints=$(for i in $(seq 1 "$nodes"); do echo "127.0.0.1:${etcd_client[$i]}"; done | paste -sd,)

start_etcd() { # member [new|existing]
  local i=$1
  etcd --name "m$i" --data-dir "$work/etcd-$i" \
    --listen-client-urls "http://127.0.0.1:${etcd_client[$i]}" \
    --advertise-client-urls "http://127.0.0.1:${etcd_client[$i]}" \
    --listen-peer-urls "http://127.0.0.1:${etcd_peer[$i]}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${etcd_peer[$i]}" \
    --initial-cluster "$etcd_cluster" --initial-cluster-state "${2:-new}" \
    --log-level error >>"$work/etcd-$i.log" 2>&1 &
  etcd_pid[$i]=$!
  pids+=($!)
}
start_palisade() { # node
  local i=$1 flags=()
  if [ "$nodes" -gt 1 ]; then flags=(--node-id "$i" --initial-cluster "$palisade_cluster"); fi
  RUST_LOG=warn "$palisade" serve --data-dir "$work/palisade-$i" \
    --listen "127.0.0.1:${lock_port[$i]}" --metrics-listen "127.0.0.1:${metrics_port[$i]}" \
    "${flags[@]}" >>"$work/palisade-$i.log" 2>&1 &
  lock_pid[$i]=$!
  pids+=($!)
}

log "starting $nodes etcd member(s) on $etcd_endpoints"
for i in $(seq 1 "$nodes"); do start_etcd "$i"; done
for i in $(seq 1 "$nodes"); do wait_for_port "${etcd_client[$i]}" "etcd-$i"; done

log "starting $nodes palisade node(s) on $lock_endpoints"
for i in $(seq 1 "$nodes"); do start_palisade "$i"; done
for i in $(seq 1 "$nodes"); do wait_for_port "${lock_port[$i]}" "palisade-$i"; done

# Each system's leader: the workloads go there.
palisade_leader() {
  for _ in $(seq 1 100); do
    local leader
    leader=$("$palisade" --endpoint "$lock_endpoints" cluster status --json 2>/dev/null |
      python3 -c 'import json,sys; d=json.load(sys.stdin); l=d["leader"]; print(l if l and any(m["id"]==l and m["role"]=="leader" for m in d["members"]) else "")' || true)
    if [ -n "$leader" ]; then echo "$leader"; return 0; fi
    sleep 0.1
  done
  log "the palisade nodes elected no leader"; exit 1
}
etcd_leader() {
  for _ in $(seq 1 100); do
    local leader
    leader=$(etcdctl --endpoints "$etcd_endpoints" endpoint status -w json 2>/dev/null |
      python3 -c 'import json,sys
for s in json.load(sys.stdin):
    if s["Status"]["header"]["member_id"] == s["Status"]["leader"]:
        print(s["Endpoint"].rsplit(":",1)[1])' || true)
    for i in $(seq 1 "$nodes"); do
      if [ "${etcd_client[$i]}" = "$leader" ]; then echo "$i"; return 0; fi
    done
    sleep 0.1
  done
  log "the etcd members elected no leader"; exit 1
}
pl=$(palisade_leader); el=$(etcd_leader)
lock_port_leader=${lock_port[$pl]}
palisade_pid=${lock_pid[$pl]}
etcd_port=${etcd_client[$el]}
public_key="$(PALISADE_ENDPOINT="$lock_endpoints" "$palisade" pubkey)"
store_port=$(free_port)
log "starting palisade store serve on 127.0.0.1:$store_port (data in $work/store)"
RUST_LOG=warn "$palisade" store serve --data-dir "$work/store" --listen "127.0.0.1:$store_port" \
  --public-key "$public_key" >"$work/store.log" 2>&1 &
pids+=($!)
wait_for_port "$store_port" store

# --- the benchmark ----------------------------------------------------------------------------
log "running every workload on both (each ${duration} after ${warmup} warm-up)"
args=(bench all --target "palisade://127.0.0.1:$lock_port_leader" --target "etcd://127.0.0.1:$etcd_port"
  --store "127.0.0.1:$store_port" --store-dir "$work" --duration "$duration" --warmup "$warmup"
  --metrics "http://127.0.0.1:${metrics_port[$pl]}/metrics" --server-pid "$palisade_pid")
if [ -n "$json_out" ]; then args+=(--json-file "$json_out"); fi
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GiB RAM; $(etcd --version | head -1)"
echo "load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "What this machine allows, measured on its primitives (\`palisade bench floor\`):"
echo
"$palisade" bench floor --store-dir "$work"
echo
"$palisade" "${args[@]}" --markdown


# --- failover (clusters only) ----------------------------------------------------------------
if [ "$nodes" -gt 1 ]; then
  now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
  # Runs a command until it succeeds, for at most 60 s.
  until_granted() {
    local give_up=$(( $(now_ms) + 60000 ))
    until "$@" >/dev/null 2>&1; do
      if [ "$(now_ms)" -gt "$give_up" ]; then log "no grant within 60 s: $*"; exit 1; fi
    done
  }
  palisade_ms=(); etcd_ms=()
  for round in $(seq 1 "$failover_rounds"); do
    pl=$(palisade_leader)
    kill -9 "${lock_pid[$pl]}"; wait "${lock_pid[$pl]}" 2>/dev/null || true
    t0=$(now_ms)
    until_granted "$palisade" --endpoint "$lock_endpoints" acquire "failover-$round" --ttl 10s
    palisade_ms+=($(( $(now_ms) - t0 )))
    start_palisade "$pl"; wait_for_port "${lock_port[$pl]}" "palisade-$pl"

    el=$(etcd_leader)
    kill -9 "${etcd_pid[$el]}"; wait "${etcd_pid[$el]}" 2>/dev/null || true
    t0=$(now_ms)
    until_granted etcdctl --endpoints "$etcd_endpoints" --dial-timeout 1s --command-timeout 5s \
      lock "failover-$round" true
    etcd_ms+=($(( $(now_ms) - t0 )))
    start_etcd "$el" existing; wait_for_port "${etcd_client[$el]}" "etcd-$el"
    # Both restarted members catch up before the next round.
    sleep 3
  done
  echo
  echo "Failover: \`kill -9\` of the leader until the next lock grant to a client given every endpoint (ms; each round's killed node restarted before the next):"
  echo
  echo "| round | palisade | etcd |"
  echo "|---|---:|---:|"
  for i in $(seq 0 $((failover_rounds - 1))); do
    echo "| $((i + 1)) | ${palisade_ms[$i]} | ${etcd_ms[$i]} |"
  done
fi
