#!/usr/bin/env bash
# Generates what clients/go takes from the rest of the repository, and commits as files because
# Go can neither run protoc at build time nor embed a file outside its module:
#
# - the Go code of the Palisade API (package palisadev1) from crates/proto/proto, with Debian's
#   protoc and protoc-gen-go / protoc-gen-go-grpc at the versions pinned below (installed with
#   `go install` from the Go module proxy into clients/go/.tools, not committed);
# - fence/redis/redis.lua, a copy of crates/fence/src/redis.lua (the one fence script every
#   language runs), which package fence/redis embeds.
#
#   scripts/generate.sh            regenerates them in clients/go (commit the result)
#   scripts/generate.sh DIR        writes them under DIR instead (DIR/palisadev1, DIR/fence/...)
#
# scripts/check-generated.sh runs it into a temporary directory and fails if the committed files
# differ: a change of the .proto or of the script without regenerating is caught there.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"
root="${1:-$here}"
out="$root/palisadev1"

# The pinned generators: a new version changes the generated text, so it is changed here, on
# purpose, and the files regenerated in the same commit.
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
MODULE=example.invalid/palisade/clients/go

if ! command -v protoc >/dev/null; then
  echo "generate: protoc is missing; install Debian's protobuf-compiler (scripts/test-services.sh does)" >&2
  exit 1
fi
tools="$here/.tools"
mkdir -p "$tools"
install_tool() { # name module-path version
  local bin="$tools/$1-$3"
  if [[ ! -x "$bin" ]]; then
    GOBIN="$tools/tmp" GOFLAGS=-mod=mod go install "$2@$3"
    mv "$tools/tmp/$1" "$bin"
    rmdir "$tools/tmp" 2>/dev/null || true
  fi
  ln -sf "$bin" "$tools/$1"
}
install_tool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION"
install_tool protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION"

mkdir -p "$out"
# The .proto names no go_package: the import path is given here, so the Rust and Python builds
# see an unchanged file.
mapping="Mpalisade.proto=$MODULE/palisadev1;palisadev1"
PATH="$tools:$PATH" protoc \
  --proto_path="$repo/crates/proto/proto" \
  --go_out="$out" --go_opt=paths=source_relative --go_opt="$mapping" \
  --go-grpc_out="$out" --go-grpc_opt=paths=source_relative --go-grpc_opt="$mapping" \
  palisade.proto

mkdir -p "$root/fence/redis"
cp "$repo/crates/fence/src/redis.lua" "$root/fence/redis/redis.lua"
