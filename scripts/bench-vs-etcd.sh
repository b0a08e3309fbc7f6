#!/usr/bin/env bash
# Renamed: scripts/bench-vs-peers.sh now compares Palisade with etcd, ZooKeeper and Redis. This
# shim keeps old commands working; note that without --nodes it runs both the single-node and
# the 3-node comparison.
exec "$(dirname "$0")/bench-vs-peers.sh" "$@"
