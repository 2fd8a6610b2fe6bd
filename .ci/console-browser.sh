#!/usr/bin/env bash
# The web console in headless Chromium against `fleet dev` (a throw-away
# database and subject root): tests/console/console_browser.py. Installs
# Debian's chromium and Playwright for Python when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x /usr/bin/chromium ]; then
  # A fresh machine may have no package lists yet: update once, then retry.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }
fi
python3 -c "import playwright" 2>/dev/null || python3 -m pip install --quiet playwright
cargo build --quiet --bin fleet
BIN=target/debug/fleet

WORK="$(mktemp -d)"
SHOTS="${CONSOLE_SHOTS:-$WORK}"
PID=""
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

export FLEET__API__LISTEN="127.0.0.1:0"
export FLEET__LOG__FILTER="warn"
$BIN dev --sim 64 --sites 1 --no-consumers --tick-secs 2 >"$WORK/dev.out" 2>"$WORK/dev.err" & PID=$!
for _ in $(seq 1 120); do
  grep -q '^token ' "$WORK/dev.out" 2>/dev/null && break
  kill -0 "$PID" 2>/dev/null || { echo "fleet dev exited:"; tail -30 "$WORK/dev.err"; exit 1; }
  sleep 1
done
API="$(awk '$1 == "API" {print $2; exit}' "$WORK/dev.out")"
TOKEN="$(awk '$1 == "token" {print $2; exit}' "$WORK/dev.out")"
DB="$(awk '$1 == "database" {print $2; exit}' "$WORK/dev.out")"
[ -n "$API" ] && [ -n "$TOKEN" ] || { echo "fleet dev printed no API address or token:"; cat "$WORK/dev.out"; tail -30 "$WORK/dev.err"; exit 1; }
READ_TOKEN="$(FLEET__DATABASE__URL="$DB" $BIN token create --scopes device:read --description console-read-only)"
# The matrix needs the devices imported first.
for _ in $(seq 1 60); do
  n="$(curl -s -H "Authorization: Bearer $TOKEN" "$API/api/v1/sites/s1/summary" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("total", 0))' 2>/dev/null || echo 0)"
  [ "$n" -ge 64 ] && break
  sleep 1
done
python3 tests/console/console_browser.py --api "$API" --token "$TOKEN" --read-token "$READ_TOKEN" --shots "$SHOTS" \
  || { echo "console-browser failed; fleet dev log:"; tail -40 "$WORK/dev.err"; exit 1; }
