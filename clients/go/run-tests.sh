#!/usr/bin/env bash
# Runs the Go client's checks: the generated code is fresh (scripts/check-generated.sh), `go vet`
# and staticcheck (pinned below, installed into clients/go/.tools from the Go module proxy) are
# clean, then `go test -race` over every package against a real `palisade serve`. Then the same
# three over the k8s module (clients/go/k8s, client-go's leader election on a Palisade lock, a
# module of its own so that the client does not depend on client-go, and its leader demo).
#
# The server binary is $PALISADE_BIN, else the debug binary of the workspace (built with cargo
# when missing). PALISADE_TEST_REQUIRE_SERVER=1 is set, so a test that finds no binary fails
# instead of skipping. PostgreSQL, MySQL and Redis come from PALISADE_TEST_POSTGRES,
# PALISADE_TEST_MYSQL and PALISADE_TEST_REDIS; their tests skip, saying so, without them.
# The cross-language test (internal/crosslang) also runs the Rust writer found beside
# $PALISADE_BIN (examples/crosslang_writer, built here when PALISADE_BIN is unset, else by the
# caller's `cargo test --workspace`) and the Python client's virtualenv (clients/python/.venv,
# made by clients/python/run-tests.sh, which .ci/run runs first).
# Arguments go to `go test` (e.g. -run Keepalive -v).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
STATICCHECK_VERSION=v0.8.2

if ! command -v go >/dev/null; then
  echo "go client: go is not installed" >&2
  exit 1
fi
cd "$here"
export GOFLAGS="${GOFLAGS:-} -mod=readonly"

echo "-- generated code"
scripts/check-generated.sh

echo "-- go vet"
go vet ./...

echo "-- staticcheck $STATICCHECK_VERSION"
tools="$here/.tools"
if [[ ! -x "$tools/staticcheck-$STATICCHECK_VERSION" ]]; then
  mkdir -p "$tools/tmp"
  GOBIN="$tools/tmp" GOFLAGS=-mod=mod go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
  mv "$tools/tmp/staticcheck" "$tools/staticcheck-$STATICCHECK_VERSION"
  rmdir "$tools/tmp"
fi
"$tools/staticcheck-$STATICCHECK_VERSION" ./...

if [[ -z "${PALISADE_BIN:-}" ]]; then
  target="${CARGO_TARGET_DIR:-$repo/target}"
  (cd "$repo" && cargo build --quiet -p palisade-cli)
  (cd "$repo" && cargo build --quiet -p palisade-fence --example crosslang_writer)
  export PALISADE_BIN="$target/debug/palisade"
fi
export PALISADE_TEST_REQUIRE_SERVER=1

echo "-- go test -race"
# -count=1: the shared vectors live outside the module, where go's test cache does not look.
go test -race -count=1 "$@" ./...

echo "-- the k8s module: go vet, staticcheck, go test -race"
cd "$here/k8s"
go vet ./...
"$tools/staticcheck-$STATICCHECK_VERSION" ./...
go test -race -count=1 "$@" ./...
