#!/usr/bin/env bash
# promtool check rules and promtool test rules on deploy/prometheus. Skips
# (exit 77) when promtool (Debian package prometheus) is not installed.
set -euo pipefail
SRC="${ALLOCD_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
if ! command -v promtool >/dev/null; then
  echo "SKIP: promtool is not installed (Debian package prometheus; scripts/install-deps installs it)"
  exit 77
fi
cd "$SRC/deploy/prometheus"
promtool --version 2>&1 | head -1
promtool check rules allocd-rules.yaml
promtool test rules allocd-rules.test.yaml
