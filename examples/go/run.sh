#!/usr/bin/env bash
# Builds examples/go/follow_status with Debian's Go and Go libraries (no Go
# module proxy needed: GOPATH mode over /usr/share/gocode), generating the
# protobuf types from schemas/ with google.golang.org/protobuf's
# protoc-gen-go, then runs it with the arguments given. Installs what is
# missing from Debian's packages.
set -euo pipefail
cd "$(dirname "$0")/../.."
need=()
command -v go >/dev/null || need+=(golang-go)
command -v protoc >/dev/null || need+=(protobuf-compiler)
[ -d /usr/share/gocode/src/github.com/nats-io/nats.go ] || need+=(golang-github-nats-io-go-nats-dev)
[ -d /usr/share/gocode/src/google.golang.org/protobuf/cmd/protoc-gen-go ] || need+=(golang-google-protobuf-dev)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
    || { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${need[@]}" >/dev/null; }
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src/fleet/examples" "$work/bin"
export GO111MODULE=off GOPATH="$work:/usr/share/gocode" GOCACHE="$work/cache"
# protoc-gen-go of google.golang.org/protobuf (the API the well-known types
# protoc ships use), built from Debian's sources.
go build -o "$work/bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
protoc -I schemas --plugin=protoc-gen-go="$work/bin/protoc-gen-go" --go_out="$work/src" schemas/fleet/v1/*.proto
cp -r examples/go/follow_status "$work/src/fleet/examples/"
go build -o "$work/follow_status" fleet/examples/follow_status
"$work/follow_status" "$@"
