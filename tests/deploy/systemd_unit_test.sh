#!/usr/bin/env bash
# deploy/systemd/allocd.service: `systemd-analyze verify` says nothing about
# it (no unknown key, bad value or missing program: ExecStart's /usr/bin/allocd
# is pointed at the build tree's), and it keeps what the daemon needs: the
# user allocd, /run/allocd as its RuntimeDirectory with the socket in it, an
# FD limit for the sim pool's chunks, the NVIDIA devices reachable. Prints
# `systemd-analyze security` exposure. Skips (exit 77) without
# systemd-analyze (Debian package systemd; scripts/install-deps installs it).
#
#   systemd_unit_test.sh ALLOCD
set -euo pipefail
SRC="${ALLOCD_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
ALLOCD=$(realpath "$1")
UNIT="$SRC/deploy/systemd/allocd.service"

if ! command -v systemd-analyze >/dev/null; then
  echo "SKIP: systemd-analyze is not installed (Debian package systemd; scripts/install-deps installs it)"
  exit 77
fi
fail() { echo "FAIL: $*"; exit 1; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
sed "s#/usr/bin/allocd #$ALLOCD #" "$UNIT" >"$WORK/allocd.service"
grep -q "^ExecStart=$ALLOCD serve" "$WORK/allocd.service" ||
  fail "ExecStart does not run /usr/bin/allocd serve"

status=0
output=$(systemd-analyze verify "$WORK/allocd.service" 2>&1 </dev/null) || status=$?
if [[ $status -ne 0 || -n "$output" ]]; then
  echo "$output"
  fail "systemd-analyze verify (exit $status) has something to say about allocd.service"
fi

value() {  # KEY: the unit's last setting of KEY
  awk -F= -v k="$1" '$1 == k {v = substr($0, length(k) + 2)} END {print v}' "$UNIT"
}
[[ "$(value User)" == allocd && "$(value Group)" == allocd ]] ||
  fail "User=/Group= should be allocd (the .deb creates them)"
[[ "$(value RuntimeDirectory)" == allocd ]] || fail "RuntimeDirectory= should be allocd"
grep -q -- '--socket=/run/allocd/allocd.sock' "$UNIT" || fail "ExecStart should serve on /run/allocd/allocd.sock"
# A sim pool holds a file descriptor per 2 MiB chunk: an 80 GiB pool 40960.
limit=$(value LimitNOFILE)
[[ "$limit" =~ ^[0-9]+$ ]] && ((limit >= 40960 + 512)) ||
  fail "LimitNOFILE=$limit is below an 80 GiB sim pool's 40960 chunk FDs + 512"
[[ "$(value PrivateDevices)" != yes ]] || fail "PrivateDevices=yes hides /dev/nvidia*"
if [[ "$(value DevicePolicy)" =~ ^(closed|strict)$ ]]; then
  grep -q '^DeviceAllow=char-nvidia-frontend rw' "$UNIT" && grep -q '^DeviceAllow=char-nvidia-uvm rw' "$UNIT" ||
    fail "DevicePolicy=$(value DevicePolicy) without DeviceAllow= of the NVIDIA devices"
fi

exposure=$(systemd-analyze security --offline=true "$WORK/allocd.service" 2>/dev/null </dev/null |
  grep -o 'Overall exposure level.*' || true)
echo "allocd.service: systemd-analyze verify clean; ${exposure:-no security analysis}"
