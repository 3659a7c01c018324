#!/usr/bin/env bash
# yamllint (strict: warnings fail) on every YAML file under deploy/, with
# deploy/.yamllint. Skips (exit 77) when yamllint is not installed.
set -euo pipefail
SRC="${ALLOCD_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
if ! command -v yamllint >/dev/null; then
  echo "SKIP: yamllint is not installed (Debian package yamllint; scripts/install-deps installs it)"
  exit 77
fi
cd "$SRC"
mapfile -t files < <(yamllint --list-files -c deploy/.yamllint deploy/)
expected=$(find deploy -name '*.yaml' -o -name '*.yml' | wc -l)
linted=$(printf '%s\n' "${files[@]}" | grep -cE '\.ya?ml$' || true)
if ((linted < expected)); then
  echo "FAIL: yamllint would check $linted of the $expected YAML files under deploy/"
  exit 1
fi
yamllint --strict --format parsable -c deploy/.yamllint deploy/
echo "yamllint $(yamllint --version | awk '{print $2}'): ${#files[@]} files under deploy/ clean"
