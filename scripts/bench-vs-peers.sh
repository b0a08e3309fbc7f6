#!/usr/bin/env bash
# Runs every `palisade bench` lock workload against Palisade and its peers on this machine, and
# prints, in one run, two markdown tables with this machine's floor (`palisade bench floor`) and
# each result as a fraction of it:
#
#   - single node: palisade, etcd 3.4, ZooKeeper 3.8 (its lock recipe), and Redis SET NX PX as the
#     unsafe reference point (no fencing token, nothing durable);
#   - 3 nodes: a 3-node Palisade cluster, a 3-member etcd cluster and a 3-server ZooKeeper
#     ensemble, the workloads aimed at each one's leader; then failover (`kill -9` of the leader
#     until the next grant a client with every endpoint gets) for Palisade and etcd.
#
#   scripts/bench-vs-peers.sh [--nodes 1|3] [--duration 5s] [--warmup 1s] [--json FILE]
#                             [--palisade-bin PATH] [--scale [-- ARGS FOR scripts/bench-scale.sh]]
#
# --nodes runs only one of the two. --json writes each run's report: FILE for the single node,
# FILE with .3-node before its extension for the clusters.
#
# Every system's server processes (every member of a cluster) are passed to the bench with
# --target-pids: beside each throughput the table gives the servers' CPU time and context
# switches per lock operation (an acquire or a release) over the measured window.
#
# --palisade-bin PATH benchmarks a saved (older) build: it replaces the palisade *server* binary
# only (`palisade serve` and `palisade store serve`). The bench client, the floor and the /proc
# readings, and the client commands (`cluster status`, `pubkey`, the failover's `acquire`) stay
# the freshly built one, so an older binary without the newer bench flags still works.
#
# Installs what is missing (Debian packages etcd-server, etcd-client, zookeeper, redis-server),
# builds palisade in release mode, starts every server on temporary directories and free loopback
# ports — durable where the system can be: etcd and Palisade fsync, ZooKeeper with forceSync=yes;
# Redis keeps nothing on disk — and stops them all on exit, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."

duration=5s
warmup=1s
json_out=""
runs="1 3"
failover_rounds=3
palisade_bin=""
scale=0
scale_args=()
usage="usage: $0 [--nodes 1|3] [--duration D] [--warmup D] [--json FILE] [--palisade-bin PATH] [--scale [-- ARGS]]"
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) runs="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --json) json_out="$2"; shift 2 ;;
    --palisade-bin) palisade_bin="$2"; shift 2 ;;
    --scale) scale=1; shift ;;
    --) shift; scale_args=("$@"); break ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
case "$runs" in "1 3"|1|3) ;; *) echo "--nodes is 1 or 3" >&2; exit 2 ;; esac
if [ -n "$palisade_bin" ] && [ ! -x "$palisade_bin" ]; then
  echo "--palisade-bin $palisade_bin is not an executable file" >&2; exit 2
fi

log() { echo "bench-vs-peers: $*" >&2; }

# --- the peers ---------------------------------------------------------------------------------
missing=()
command -v etcd >/dev/null || missing+=(etcd-server)
command -v etcdctl >/dev/null || missing+=(etcd-client)
[ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
command -v redis-server >/dev/null || missing+=(redis-server)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]} (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  }
fi
command -v java >/dev/null || { log "ZooKeeper needs java, which the zookeeper package did not bring"; exit 1; }
zk_classpath="/etc/zookeeper/conf:/usr/share/java/zookeeper.jar"

# --- palisade ----------------------------------------------------------------------------------
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
log "building palisade (release)"
cargo build --release -q -p palisade-cli
palisade="$CARGO_TARGET_DIR/release/palisade"
# The servers' binary: the fresh build unless --palisade-bin names another.
palisade_server="${palisade_bin:-$palisade}"
if [ -n "$palisade_bin" ]; then log "palisade servers from $palisade_bin; the bench client is $palisade"; fi

# --- services ----------------------------------------------------------------------------------
work="$(mktemp -d -t palisade-bench-vs-peers.XXXXXX)"
pids=()
stop_services() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    # Give each a few seconds to stop, then insist.
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  pids=()
}
cleanup() {
  stop_services
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
wait_for_port() { # port name
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  log "$2 did not start listening on 127.0.0.1:$1; its log:"
  tail -20 "$dir/$2.log" >&2 || true
  exit 1
}
# A ZooKeeper four-letter-word command's answer (srvr is allowed in every server's zoo.cfg).
zk_4lw() { # port command
  (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf '%s' "$2" >&3 && timeout 2 cat <&3) 2>/dev/null || true
}
# The installed versions, for the report.
versions() {
  local zk
  zk=$(dpkg-query -W -f '${Version}' zookeeper 2>/dev/null || echo '?')
  echo "$(etcd --version | head -1); ZooKeeper $zk (Debian package zookeeper); $(redis-server --version | cut -d' ' -f1-3)"
}

# One run: every system with `nodes` members each, on fresh directories and ports.
run() { # nodes
  local nodes=$1 i
  dir="$work/$nodes-node"
  mkdir -p "$dir"
  declare -g -a etcd_client etcd_peer etcd_pid lock_port lock_pid metrics_port zk_client zk_pid
  local etcd_cluster="" palisade_cluster="" zk_servers=""
  for i in $(seq 1 "$nodes"); do
    etcd_client[$i]=$(free_port); etcd_peer[$i]=$(free_port); lock_port[$i]=$(free_port)
    metrics_port[$i]=$(free_port); zk_client[$i]=$(free_port)
    etcd_cluster+="${etcd_cluster:+,}m$i=http://127.0.0.1:${etcd_peer[$i]}"
    palisade_cluster+="${palisade_cluster:+,}$i=127.0.0.1:${lock_port[$i]}"
    zk_servers+="server.$i=127.0.0.1:$(free_port):$(free_port)"$'\n'
  done
  lock_endpoints=$(for i in $(seq 1 "$nodes"); do echo "127.0.0.1:${lock_port[$i]}"; done | paste -sd,)
  etcd_endpoints=$(for i in $(seq 1 "$nodes"); do echo "127.0.0.1:${etcd_client[$i]}"; done | paste -sd,)

  start_etcd() { # member [new|existing]
    local i=$1
    etcd --name "m$i" --data-dir "$dir/etcd-$i" \
      --listen-client-urls "http://127.0.0.1:${etcd_client[$i]}" \
      --advertise-client-urls "http://127.0.0.1:${etcd_client[$i]}" \
      --listen-peer-urls "http://127.0.0.1:${etcd_peer[$i]}" \
      --initial-advertise-peer-urls "http://127.0.0.1:${etcd_peer[$i]}" \
      --initial-cluster "$etcd_cluster" --initial-cluster-state "${2:-new}" \
      --log-level error >>"$dir/etcd-$i.log" 2>&1 &
    etcd_pid[$i]=$!
    pids+=($!)
  }
  start_palisade() { # node
    local i=$1 flags=()
    if [ "$nodes" -gt 1 ]; then flags=(--node-id "$i" --initial-cluster "$palisade_cluster"); fi
    RUST_LOG=warn "$palisade_server" serve --data-dir "$dir/palisade-$i" \
      --listen "127.0.0.1:${lock_port[$i]}" --metrics-listen "127.0.0.1:${metrics_port[$i]}" \
      "${flags[@]}" >>"$dir/palisade-$i.log" 2>&1 &
    lock_pid[$i]=$!
    pids+=($!)
  }
  start_zookeeper() { # server
    local i=$1 data="$dir/zk-$i"
    mkdir -p "$data"
    # forceSync=yes: each transaction is fsynced before it is acknowledged (ZooKeeper's default,
    # written out so that nobody wonders).
    cat >"$data/zoo.cfg" <<EOF
tickTime=2000
initLimit=10
syncLimit=5
dataDir=$data
clientPort=${zk_client[$i]}
clientPortAddress=127.0.0.1
forceSync=yes
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=srvr
EOF
    if [ "$nodes" -gt 1 ]; then
      printf '%s' "$zk_servers" >>"$data/zoo.cfg"
      echo "$i" >"$data/myid"
    fi
    java -Xms256m -Xmx512m -cp "$zk_classpath" org.apache.zookeeper.server.quorum.QuorumPeerMain \
      "$data/zoo.cfg" >>"$dir/zookeeper-$i.log" 2>&1 &
    zk_pid[$i]=$!
    pids+=($!)
  }

  log "starting $nodes etcd member(s), palisade node(s) and ZooKeeper server(s)"
  for i in $(seq 1 "$nodes"); do start_etcd "$i"; start_palisade "$i"; start_zookeeper "$i"; done
  for i in $(seq 1 "$nodes"); do
    wait_for_port "${etcd_client[$i]}" "etcd-$i"
    wait_for_port "${lock_port[$i]}" "palisade-$i"
    wait_for_port "${zk_client[$i]}" "zookeeper-$i"
  done
  local redis_port="" redis_pid=""
  if [ "$nodes" -eq 1 ]; then
    redis_port=$(free_port)
    mkdir -p "$dir/redis"
    redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$dir/redis" --save "" \
      --appendonly no --daemonize no >"$dir/redis.log" 2>&1 &
    redis_pid=$!
    pids+=($!)
    wait_for_port "$redis_port" redis
  fi

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
  zk_leader() {
    for _ in $(seq 1 300); do
      for i in $(seq 1 "$nodes"); do
        if zk_4lw "${zk_client[$i]}" srvr | grep -Eq '^Mode: (leader|standalone)'; then
          echo "$i"; return 0
        fi
      done
      sleep 0.1
    done
    log "the ZooKeeper servers elected no leader"; exit 1
  }
  local pl el zl
  pl=$(palisade_leader); el=$(etcd_leader); zl=$(zk_leader)
  local public_key store_port
  public_key="$(PALISADE_ENDPOINT="$lock_endpoints" "$palisade" pubkey)"
  store_port=$(free_port)
  RUST_LOG=warn "$palisade_server" store serve --data-dir "$dir/store" --listen "127.0.0.1:$store_port" \
    --public-key "$public_key" >"$dir/store.log" 2>&1 &
  pids+=($!)
  wait_for_port "$store_port" store

  local args=(bench all --target "palisade://127.0.0.1:${lock_port[$pl]}"
    --target "etcd://127.0.0.1:${etcd_client[$el]}" --target "zk://127.0.0.1:${zk_client[$zl]}")
  if [ -n "$redis_port" ]; then
    args+=(--target "redis://127.0.0.1:$redis_port" --target-pids "redis=$redis_pid")
  fi
  # Every member's process: a follower's CPU is part of what an operation costs.
  local members
  members=$(seq 1 "$nodes")
  args+=(--target-pids "palisade=$(for i in $members; do echo "${lock_pid[$i]}"; done | paste -sd,)"
    --target-pids "etcd=$(for i in $members; do echo "${etcd_pid[$i]}"; done | paste -sd,)"
    --target-pids "zk=$(for i in $members; do echo "${zk_pid[$i]}"; done | paste -sd,)")
  args+=(--store "127.0.0.1:$store_port" --store-dir "$dir" --duration "$duration" --warmup "$warmup"
    --metrics "http://127.0.0.1:${metrics_port[$pl]}/metrics" --nodes "$nodes"
    --floor --markdown)
  if [ -n "$json_out" ]; then
    if [ "$nodes" -eq 1 ]; then
      args+=(--json-file "$json_out")
    else
      local base="${json_out%.json}"
      args+=(--json-file "$base.3-node.json")
    fi
  fi
  echo
  if [ "$nodes" -eq 1 ]; then
    echo "## Single node: palisade, etcd, ZooKeeper, Redis (unsafe)"
  else
    echo "## 3 nodes: a palisade cluster, an etcd cluster, a ZooKeeper ensemble (workloads on each leader)"
  fi
  echo
  echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GiB RAM; $(versions)"
  echo "load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  log "running every workload on each ($duration after $warmup warm-up)"
  "$palisade" "${args[@]}"
  echo
  echo "load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)"

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
    local palisade_ms=() etcd_ms=() round t0
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
  stop_services
}

for nodes in $runs; do run "$nodes"; done

# --- scale -------------------------------------------------------------------------------------
# `--scale` ends the run with the scale table: scripts/bench-scale.sh, given the arguments after
# `--` (its own, e.g. `--time-limit 10m --no-etcd`).
if [ "$scale" -eq 1 ]; then
  echo
  scripts/bench-scale.sh "${scale_args[@]}"
fi
