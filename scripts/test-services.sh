#!/usr/bin/env bash
# The servers the adapter tests talk to, on loopback: PostgreSQL (5432), Redis (6379), MariaDB
# (3306), NATS with JetStream (4222), the ZooKeeper (2181) the bench's zk:// target is tested
# against, and an S3-compatible object store (versitygw, 7070) for the S3 fence. Installs whichever
# is missing from Debian's packages (postgresql, redis-server, mariadb-server, nats-server,
# zookeeper) and builds versitygw from the Go module proxy, sets a
# fresh install up for password-less loopback access as the tests connect (a test machine's
# setting, never a production one), creates the `test` databases, starts what is down, and fails
# if a server still cannot be reached. versitygw is built from the Go module proxy (`go install`,
# about 4 minutes on a cold machine, then kept). `.ci/run` calls it; it needs root.
set -euo pipefail

reachable() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for_port() { # port name
  for _ in $(seq 1 100); do
    if reachable "$1"; then return 0; fi
    sleep 0.2
  done
  echo "test services: $2 is not reachable on 127.0.0.1:$1; the adapter tests need it" >&2
  return 1
}

missing=()
ls /etc/postgresql/*/main >/dev/null 2>&1 || missing+=(postgresql)
command -v redis-server >/dev/null || missing+=(redis-server)
[ -x /usr/sbin/mariadbd ] || [ -x /usr/sbin/mysqld ] || missing+=(mariadb-server)
[ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || missing+=(nats-server)
if [ ${#missing[@]} -gt 0 ]; then
  echo "test services: installing ${missing[*]} from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# PostgreSQL: the tests connect as postgres over TCP without a password. Each step checks its own
# state, so a run that stopped half way is finished by the next one.
pg_version="$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1 || true)"
if [ -z "$pg_version" ] || [ ! -d "/etc/postgresql/$pg_version/main" ]; then
  echo "test services: PostgreSQL is installed but has no cluster in /etc/postgresql/*/main" >&2
  exit 1
fi
hba="/etc/postgresql/$pg_version/main/pg_hba.conf"
if ! grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
  echo "test services: letting PostgreSQL trust loopback connections ($hba)"
  # Rewritten in place, so the file keeps its owner and mode.
  { printf 'local all postgres trust\nhost all all 127.0.0.1/32 trust\n'; cat "$hba"; } > "$hba.new"
  cat "$hba.new" > "$hba"
  rm -f "$hba.new"
  # The package may have started the cluster with its own rules already.
  if reachable 5432; then pg_ctlcluster --skip-systemctl-redirect "$pg_version" main reload; fi
fi
if ! reachable 5432; then
  pg_ctlcluster --skip-systemctl-redirect "$pg_version" main start || true
fi
wait_for_port 5432 PostgreSQL
if ! psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1; then
  createdb -h 127.0.0.1 -U postgres test
fi

# Redis: nothing kept on disk.
if ! reachable 6379; then
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no || true
fi
wait_for_port 6379 Redis

# MariaDB: the tests connect as root over TCP without a password. The SysV script starts
# mysqld_safe, which needs no systemd; its own readiness check can wait 30 s and then report a
# failure while the server is up, so the port is what decides.
if ! reachable 3306; then
  service mariadb start >/dev/null 2>&1 || true
fi
wait_for_port 3306 MariaDB
if ! mariadb --user=root --host=127.0.0.1 --execute 'SELECT 1' >/dev/null 2>&1; then
  # Debian's root authenticates by its unix socket only; allow an empty password over TCP too.
  echo "test services: letting MariaDB's root in over loopback without a password"
  mariadb --user=root --execute \
    "ALTER USER root@localhost IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('')"
fi
mariadb --user=root --host=127.0.0.1 --execute 'CREATE DATABASE IF NOT EXISTS test'

# ZooKeeper: standalone, its data in /var/lib/palisade-test-zookeeper (a test machine's server:
# nothing there is kept for anyone). Debian's zookeeper package has the server but no service,
# so it is started here, detached, and outlives this script like the others.
if ! reachable 2181; then
  zk_dir=/var/lib/palisade-test-zookeeper
  mkdir -p "$zk_dir/data"
  cat >"$zk_dir/zoo.cfg" <<EOF
tickTime=2000
dataDir=$zk_dir/data
clientPort=2181
clientPortAddress=127.0.0.1
forceSync=yes
maxClientCnxns=0
admin.enableServer=false
EOF
  setsid java -Xms64m -Xmx256m -cp /etc/zookeeper/conf:/usr/share/java/zookeeper.jar \
    org.apache.zookeeper.server.quorum.QuorumPeerMain "$zk_dir/zoo.cfg" \
    >"$zk_dir/zookeeper.log" 2>&1 </dev/null &
fi
wait_for_port 2181 ZooKeeper

# NATS with JetStream: the fenced publish's tests need `Nats-Expected-Last-Subject-Sequence`
# (Debian's 2.9 has it). Its store in /var/lib/palisade-test-nats (a test machine's server: nothing
# there is kept for anyone); the package's systemd unit is not used. Started detached, like
# ZooKeeper.
if ! reachable 4222; then
  nats_dir=/var/lib/palisade-test-nats
  mkdir -p "$nats_dir/store"
  setsid /usr/sbin/nats-server --jetstream --store_dir "$nats_dir/store" --addr 127.0.0.1 \
    --port 4222 --log "$nats_dir/nats-server.log" >/dev/null 2>&1 </dev/null &
fi
wait_for_port 4222 NATS

# S3: versitygw, an Apache-2.0 S3 gateway over a POSIX directory, chosen because its PutObject
# evaluates If-Match and If-None-Match: * under a per-key publish lock (a 412 for a failed
# condition, tested upstream with racing writers), it is one `go install` from the module proxy,
# and it starts in a second. Fixed test credentials; the bucket `palisade-test` is a directory.
# Its data is in /var/lib/palisade-test-s3 (a test machine's server: nothing there is kept).
s3_version=v1.8.0
s3_dir=/var/lib/palisade-test-s3
s3_bin="$s3_dir/versitygw-$s3_version"
if [ ! -x "$s3_bin" ]; then
  echo "test services: building versitygw $s3_version from the Go module proxy"
  mkdir -p "$s3_dir/bin"
  PATH="$PATH:/usr/local/go/bin" GOBIN="$s3_dir/bin" GOFLAGS=-modcacherw \
    go install "github.com/versity/versitygw/cmd/versitygw@$s3_version"
  mv "$s3_dir/bin/versitygw" "$s3_bin"
fi
if ! reachable 7070; then
  mkdir -p "$s3_dir/data/palisade-test"
  setsid "$s3_bin" --access palisadetest --secret palisadetestsecret --port 127.0.0.1:7070 --quiet \
    posix "$s3_dir/data" >"$s3_dir/versitygw.log" 2>&1 </dev/null &
fi
wait_for_port 7070 versitygw
