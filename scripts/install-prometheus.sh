#!/usr/bin/env bash
# Prometheus 2.42, server and promtool, from Debian's package `prometheus` (DESIGN.md: checks from outside):
# promtool checks and unit-tests every rule and scaling query the stacks render (make test), and
# `make local MONITOR=1` runs the server. The package's own service is never left running or enabled: it
# would hold 127.0.0.1:9090, where `make local MONITOR=1` starts Prometheus with the stack's rules.
set -euo pipefail

if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "make prometheus: promtool is missing; install Debian's package as root: apt-get install -y --no-install-recommends prometheus" >&2
  exit 2
fi
export DEBIAN_FRONTEND=noninteractive
# Keep the package's service from starting at install (policy-rc.d 101 = "not now"), unless a policy exists.
policy=/usr/sbin/policy-rc.d
ours=""
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  ours=1
fi
cleanup() { if [ -n "$ours" ]; then rm -f "$policy"; fi; }
trap cleanup EXIT
apt-get update -qq
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# Installed, not running, not started at boot (systemd where it runs, else the sysvinit links).
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  systemctl disable --now prometheus.service >/dev/null 2>&1 || true
else
  /etc/init.d/prometheus stop >/dev/null 2>&1 || true
  update-rc.d prometheus disable >/dev/null 2>&1 || true
fi
promtool --version | head -1
