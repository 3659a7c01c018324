#!/usr/bin/env bash
# The .deb (cmake/packaging.cmake): `cpack -G DEB` in this build tree (into a
# scratch directory), then dpkg-deb -I (package, version, Depends from
# dpkg-shlibdeps, conffiles, maintainer scripts) and -c (the binaries, the
# Python package with its libraries, the systemd unit, /etc files); then
# dpkg -x into a scratch root and, from there: allocd and allocctl --help,
# the Python package's libraries load, and the unit's ExecStart (paths moved
# into the root) serves with the shipped config.json until SIGTERM. Skips
# (exit 77) without cpack, dpkg-deb or dpkg-shlibdeps (dpkg-dev;
# scripts/install-deps installs it).
#
#   deb_test.sh BUILD_DIR VERSION WITH_CUDA_LIBRARIES(0|1)
set -euo pipefail
BUILD=$(realpath "$1")
VERSION=$2
WITH_CUDA=$3

for tool in cpack dpkg-deb dpkg-shlibdeps; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool is not installed (dpkg-shlibdeps: Debian package dpkg-dev; scripts/install-deps installs it)"
    exit 77
  fi
done
fail() { echo "FAIL: $*"; exit 1; }

WORK=$(mktemp -d)
DAEMON_PID=""
cleanup() {
  [[ -z "$DAEMON_PID" ]] || kill -KILL "$DAEMON_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

(cd "$BUILD" && cpack -G DEB -B "$WORK/out" >"$WORK/cpack.log" 2>&1) ||
  { cat "$WORK/cpack.log"; fail "cpack -G DEB failed"; }
deb=$(ls "$WORK"/out/*.deb)
echo "built $(basename "$deb") ($(stat -c %s "$deb") bytes)"

# ---- control -----------------------------------------------------------------
dpkg-deb -I "$deb" | tee "$WORK/info.txt"
field() { dpkg-deb -f "$deb" "$1"; }
[[ "$(field Package)" == allocd ]] || fail "Package is $(field Package)"
[[ "$(field Version)" == "$VERSION" ]] || fail "Version is $(field Version), the project's $VERSION"
depends=$(field Depends)
for dep in python3 passwd libgrpc++ libprotobuf libprometheus-cpp-pull libabsl; do
  [[ "$depends" == *"$dep"* ]] || fail "Depends lacks $dep: $depends"
done
dpkg-deb -e "$deb" "$WORK/control"
for script in postinst prerm postrm; do
  [[ -x "$WORK/control/$script" ]] || fail "no executable maintainer script $script"
done
grep -q 'useradd --system' "$WORK/control/postinst" || fail "postinst does not create the user allocd"
[[ "$(sort "$WORK/control/conffiles")" == $'/etc/allocd/config.json\n/etc/default/allocd' ]] ||
  fail "conffiles should be /etc/allocd/config.json and /etc/default/allocd: $(cat "$WORK/control/conffiles")"

# ---- contents ----------------------------------------------------------------
dpkg-deb -c "$deb" | tee "$WORK/contents.txt"
py=./usr/lib/python3/dist-packages/allocd
expected=(./usr/bin/allocd ./usr/bin/allocctl "$py/__init__.py" "$py/_engine.py"
  "$py/_tracker.py" "$py/_trace_tracker.cpp" "$py/liballocd_client.so"
  ./usr/lib/systemd/system/allocd.service ./etc/default/allocd ./etc/allocd/config.json)
if [[ "$WITH_CUDA" == 1 ]]; then
  expected+=("$py/liballocd_torch.so" ./usr/lib/allocd/liballocd_interpose.so
    ./usr/lib/allocd/_run/sitecustomize.py "$py/_run/sitecustomize.py")
fi
for path in "${expected[@]}"; do
  grep -q " $path\$" "$WORK/contents.txt" || fail "the package lacks $path"
done
if grep -E ' \./(usr/local|home|root|tmp|work)/| \./usr/(include|share/doc/allocd/.*\.a)' "$WORK/contents.txt"; then
  fail "the package installs files outside Debian's paths (above)"
fi

# ---- installed into a scratch root ----------------------------------------------
root="$WORK/root"
dpkg -x "$deb" "$root"
"$root/usr/bin/allocd" --help >/dev/null || fail "allocd --help from the package failed"
"$root/usr/bin/allocctl" --help >/dev/null || fail "allocctl --help from the package failed"
# Each library in a process of its own, as the package loads them (advise()
# the client, enable() the torch library: each carries the protocol's
# protobuf descriptors, which one process registers once).
# (A sanitized build's libraries need the sanitizer runtime preloaded.)
for lib in "$root"/usr/lib/python3/dist-packages/allocd/*.so; do
  LD_PRELOAD=${ALLOCD_SANITIZER_PRELOAD:-} ASAN_OPTIONS=detect_leaks=0 \
  python3 - "$root/usr/lib/python3/dist-packages" "$(basename "$lib")" <<'EOF'
import ctypes, pathlib, sys
sys.path.insert(0, sys.argv[1])
import allocd
lib = pathlib.Path(allocd.__file__).parent / sys.argv[2]
ctypes.CDLL(str(lib))
print(f"import allocd from {lib.parent}; {lib.name} loads")
EOF
done

# The unit's ExecStart, its paths moved into the scratch root, with
# ALLOCD_ARGS as /etc/default/allocd might set them.
unit="$root/usr/lib/systemd/system/allocd.service"
exec_start=$(awk '/^ExecStart=/ {line = substr($0, 11); while (line ~ /\\$/) {sub(/\\$/, "", line); getline next_line; line = line next_line} print line}' "$unit")
run="$WORK/run/allocd"
mkdir -p "$run"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ALLOCD_ARGS="--metrics-addr=127.0.0.1:$port --capacity=64MiB"
command=${exec_start//\/usr\/bin\//$root/usr/bin/}
command=${command//\/etc\/allocd\//$root/etc/allocd/}
command=${command//\/run\/allocd\//$run/}
command=${command//\$ALLOCD_ARGS/$ALLOCD_ARGS}
echo "ExecStart: $command"
# shellcheck disable=SC2086  # split like systemd splits an unquoted $VAR
$command >"$WORK/daemon.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 50); do
  "$root/usr/bin/allocctl" --socket "$run/allocd.sock" health >/dev/null 2>&1 && break
  kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$WORK/daemon.log"; fail "the unit's ExecStart exited"; }
  sleep 0.1
done
"$root/usr/bin/allocctl" --socket "$run/allocd.sock" health
kill -TERM "$DAEMON_PID"
status=0
wait "$DAEMON_PID" || status=$?
DAEMON_PID=""
cat "$WORK/daemon.log"
[[ $status -eq 0 ]] || fail "the daemon exited $status after SIGTERM"
[[ ! -e "$run/allocd.sock" ]] || fail "the socket outlived SIGTERM"
echo "the .deb holds together"
