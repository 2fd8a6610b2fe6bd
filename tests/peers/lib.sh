# tests/peers/lib.sh: what the peer scripts share; each sources it after setting ME and
# defining its own die (which tails its own log).

say() { echo "$ME: $*"; }

# alive PIDFILE NAME: the pid in PIDFILE runs and its command line names NAME (guards against reused pids).
alive() {
  local pid
  [ -s "$1" ] && pid=$(cat "$1" 2>/dev/null) && [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null \
    && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$2"
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# apt_install PKG...: installs Debian 12 packages (as root) without letting a packaged service
# start: a temporary policy-rc.d while apt-get runs.
apt_install() {
  local missing=" $*" policy=""
  command -v apt-get >/dev/null || die "missing packages:$missing and no apt-get here (needs Debian 12)"
  [ "$(id -u)" = 0 ] || die "missing packages:$missing: run as root to install them"
  say "installing$missing (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d; printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod 755 "$policy"
  fi
  local ok=0
  # shellcheck disable=SC2086
  { apt-get install -y --no-install-recommends $missing >/dev/null 2>&1 \
    || { apt-get update >/dev/null && apt-get install -y --no-install-recommends $missing >/dev/null; }; } \
    || ok=1
  if [ -n "$policy" ]; then rm -f "$policy"; fi
  [ "$ok" = 0 ] || die "apt-get install$missing failed"
}
