#!/usr/bin/env bash
# Builds examples/go/follow_status with Debian's Go and Go libraries (no Go
# module proxy needed: GOPATH mode over /usr/share/gocode), generating the
# protobuf types from schemas/ with protoc-gen-go, then runs it with the
# arguments given. Installs what is missing from Debian's packages.
set -euo pipefail
cd "$(dirname "$0")/../.."
need=()
command -v go >/dev/null || need+=(golang-go)
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v protoc-gen-go >/dev/null || need+=(golang-goprotobuf-dev)
[ -d /usr/share/gocode/src/github.com/nats-io/nats.go ] || need+=(golang-github-nats-io-go-nats-dev)
[ -d /usr/share/gocode/src/github.com/golang/protobuf ] || need+=(golang-goprotobuf-dev)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
    || { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${need[@]}" >/dev/null; }
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src/fleet/examples"
protoc -I schemas --go_out="$work/src" schemas/fleet/v1/*.proto
cp -r examples/go/follow_status "$work/src/fleet/examples/"
GO111MODULE=off GOPATH="$work:/usr/share/gocode" GOCACHE="$work/cache" \
  go build -o "$work/follow_status" fleet/examples/follow_status
"$work/follow_status" "$@"
