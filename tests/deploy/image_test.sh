#!/usr/bin/env bash
# Builds the container image (deploy/docker/Dockerfile) and runs the daemon
# in it, the way docs/deploy.md's "Image" section does without a registry:
#   1. debian:12 and debian:12-slim, the Dockerfile's base images, from
#      Debian's packages: mmdebstrap (bookworm, minbase, from this machine's
#      apt sources) -> tarball -> buildah from scratch + add + commit; slim
#      is debian:12 with the docs, man pages and locales dropped and kept
#      out by dpkg, as Debian's official -slim image;
#   2. buildah bud --isolation chroot --target runtime-prebuilt, with the
#      binaries of this build tree (cmake --install) as the build context
#      allocd-prebuilt;
#   3. buildah run --isolation chroot of the image's ENTRYPOINT + CMD, with
#      the socket directory mounted from the host; from outside: allocctl
#      health and status, allocd client-replay of a shipped trace, /metrics;
#      then SIGTERM: exit 0, sockets removed, "shut down" logged.
# Everything lives in a private buildah store (vfs driver) under the build
# tree, removed at the end; only the mmdebstrap tarball is kept there
# (keyed by the apt sources and the mmdebstrap options), so a second run in
# the same build tree skips the download. Prints the time of each phase.
#
# Skips (exit 77) when not root, when buildah or mmdebstrap is missing
# (scripts/install-deps installs them), when no Debian mirror is reachable,
# or when buildah cannot run a chroot-isolated container here.
#
#   image_test.sh BUILD_DIR ALLOCD ALLOCCTL
set -euo pipefail
SRC="${ALLOCD_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
BUILD=$(realpath "$1")
ALLOCD=$(realpath "$2")
ALLOCCTL=$(realpath "$3")
TRACE="$SRC/traces/llama_lora.pickle.gz"

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[[ $(id -u) -eq 0 ]] || skip "needs root (mmdebstrap and buildah --isolation chroot run as root here)"
for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null ||
    skip "$tool is not installed (Debian package $tool; scripts/install-deps installs it)"
done

WORK=$(mktemp -d "$BUILD/image-test.XXXXXX")
CACHE="$BUILD/image-test-cache"
STORE=(--root "$WORK/storage" --runroot "$WORK/runroot" --storage-driver vfs)
bah() { buildah "${STORE[@]}" "$@"; }
RUN_PID=""
descendants() {  # PID: its children, grandchildren, ... (from /proc)
  local child
  for child in $(awk -v p="$1" '$4 == p {print $1}' /proc/[0-9]*/stat 2>/dev/null); do
    echo "$child"
    descendants "$child"
  done
}
cleanup() {
  if [[ -n "$RUN_PID" ]] && kill -0 "$RUN_PID" 2>/dev/null; then
    for p in $(descendants "$RUN_PID") "$RUN_PID"; do kill -KILL "$p" 2>/dev/null || true; done
    wait "$RUN_PID" 2>/dev/null || true
  fi
  bah rm --all >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

declare -a TIMES=()
test_start=$(date +%s.%N)
phase_start=$test_start
phase_done() {  # NAME: records the seconds since the previous phase ended
  local now; now=$(date +%s.%N)
  TIMES+=("$(awk -v a="$phase_start" -v b="$now" -v n="$1" 'BEGIN {printf "%-24s %6.1f s", n, b - a}')")
  phase_start=$now
}
print_times() {
  printf '  %s\n' "${TIMES[@]}"
  awk -v a="$test_start" -v b="$(date +%s.%N)" 'BEGIN {printf "  %-24s %6.1f s\n", "total", b - a}'
}

# ---- 1. base images ----------------------------------------------------------
sources=()
for f in /etc/apt/sources.list /etc/apt/sources.list.d/debian.sources; do
  [[ -s "$f" ]] && sources+=("$f")
done
((${#sources[@]})) || skip "no Debian apt sources on this machine (/etc/apt/sources.list or sources.list.d/debian.sources)"
MMDEBSTRAP=(mmdebstrap --variant=minbase --mode=root --skip=output/dev bookworm)
key=$( (echo "${MMDEBSTRAP[*]}"; cat "${sources[@]}") | sha256sum | cut -c1-16)
tarball="$CACHE/debian-12-minbase-$key.tar"
if [[ -s "$tarball" ]]; then
  echo "base: cached $tarball"
  phase_done "mmdebstrap (cached)"
else
  mkdir -p "$CACHE"
  rm -f "$CACHE"/debian-12-minbase-*.tar
  echo "base: ${MMDEBSTRAP[*]} (${sources[*]})"
  if ! "${MMDEBSTRAP[@]}" "$WORK/base.tar" "${sources[@]}" >"$WORK/mmdebstrap.log" 2>&1; then
    cat "$WORK/mmdebstrap.log"
    if grep -qE 'Could not resolve|Failed to fetch|Unable to connect|Temporary failure resolving' \
        "$WORK/mmdebstrap.log"; then
      skip "mmdebstrap cannot reach the Debian mirror of ${sources[*]}"
    fi
    fail "mmdebstrap failed (log above)"
  fi
  mv "$WORK/base.tar" "$tarball"
  phase_done "mmdebstrap"
fi

ctr=$(bah from scratch)
bah add --quiet "$ctr" "$tarball" /
bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --cmd bash "$ctr"
bah commit --quiet --rm "$ctr" docker.io/library/debian:12 >/dev/null

if ! probe=$(bah run --isolation chroot "$(bah from --pull=never docker.io/library/debian:12)" \
    -- true 2>&1); then
  skip "buildah cannot run a container with --isolation chroot here: $probe"
fi
bah rm --all >/dev/null

# debian:12-slim: what Debian's slim images drop (debuerreotype's --slim):
# documentation but the copyright files, man and info pages, translations.
ctr=$(bah from --pull=never docker.io/library/debian:12)
bah run --isolation chroot "$ctr" -- sh -euc '
  cat >/etc/dpkg/dpkg.cfg.d/docker-slim <<EOF
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
  find /usr/share/doc -mindepth 1 ! -name copyright ! -type d -delete
  find /usr/share/doc -mindepth 1 -type d -empty -delete
  rm -rf /usr/share/man/* /usr/share/info/*
  find /usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +'
bah commit --quiet --rm --squash "$ctr" docker.io/library/debian:12-slim >/dev/null
phase_done "import debian:12, -slim"
bah images

# ---- 2. the image ------------------------------------------------------------
cmake --install "$BUILD" --prefix "$WORK/prefix" >/dev/null
[[ -x "$WORK/prefix/bin/allocd" && -x "$WORK/prefix/bin/allocctl" ]] ||
  fail "cmake --install $BUILD did not install bin/allocd and bin/allocctl"
bah bud --isolation chroot --format docker --pull=never --target runtime-prebuilt \
  --build-context allocd-prebuilt="$WORK/prefix" \
  --ignorefile "$SRC/deploy/docker/Dockerfile.dockerignore" \
  -f "$SRC/deploy/docker/Dockerfile" -t localhost/allocd:test "$SRC"
phase_done "buildah bud"
bah images

# ---- 3. run it ---------------------------------------------------------------
# The sim pool holds a file descriptor per chunk (the daemon says so and
# exits when the limit is too low): as high as this machine lets a process
# raise it (a container runtime sets it high; buildah run defaults to 1024).
ctr=$(bah from --pull=never --ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" localhost/allocd:test)
bah inspect "$ctr" >"$WORK/inspect.json"
# The image's USER, and its ENTRYPOINT + CMD with the metrics port made free
# on this machine (chroot isolation shares the host's network).
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mapfile -t argv < <(python3 - "$WORK/inspect.json" "$port" <<'EOF'
import json, sys
config = json.load(open(sys.argv[1]))["OCIv1"]["config"]
entrypoint, cmd = config.get("Entrypoint"), config.get("Cmd") or []
print(f"image: USER {config.get('User')}, ENTRYPOINT {entrypoint}, CMD {cmd}", file=sys.stderr)
if entrypoint != ["allocd"]:
    sys.exit(f"FAIL: ENTRYPOINT is {entrypoint}, not ['allocd']")
if cmd[:1] != ["serve"] or "--socket=/run/allocd/allocd.sock" not in cmd:
    sys.exit(f"FAIL: CMD {cmd} does not serve on /run/allocd/allocd.sock")
print(config.get("User", ""))
for a in entrypoint + cmd:
    print(f"--metrics-addr=127.0.0.1:{sys.argv[2]}" if a.startswith("--metrics-addr") else a)
EOF
)
((${#argv[@]} > 1)) || fail "could not read the image's USER, ENTRYPOINT and CMD"
user=${argv[0]}
argv=("${argv[@]:1}")
[[ "$user" =~ ^[1-9][0-9]*:[0-9]+$ ]] || fail "the image's USER is '$user', not a non-root uid:gid"

sockdir="$WORK/run-allocd"
install -d -o "${user%%:*}" -g "${user##*:}" -m 0750 "$sockdir"
sock="$sockdir/allocd.sock"
bah run --isolation chroot -v "$sockdir:/run/allocd" "$ctr" -- "${argv[@]}" \
  >"$WORK/daemon.log" 2>&1 &
RUN_PID=$!

for _ in $(seq 100); do
  [[ -S "$sock" ]] && "$ALLOCCTL" --socket "$sock" health >/dev/null 2>&1 && break
  kill -0 "$RUN_PID" 2>/dev/null || { cat "$WORK/daemon.log"; fail "the daemon in the image exited"; }
  sleep 0.2
done
daemon_pid=""
for p in $(descendants "$RUN_PID"); do
  [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == allocd ]] && daemon_pid=$p
done
[[ -n "$daemon_pid" ]] || { cat "$WORK/daemon.log"; fail "no allocd process under buildah run"; }
uid=$(awk '/^Uid:/ {print $2}' "/proc/$daemon_pid/status")
echo "daemon: pid $daemon_pid, uid $uid, root $(readlink "/proc/$daemon_pid/root")"
[[ "$uid" == "${user%%:*}" ]] || fail "the daemon runs as uid $uid, not the image's USER $user"
phase_done "daemon up"

"$ALLOCCTL" --socket "$sock" health
"$ALLOCCTL" --socket "$sock" status
"$ALLOCD" client-replay "$TRACE" --socket "$sock" --job image-test
"$ALLOCCTL" --socket "$sock" status | tee "$WORK/status.txt"
grep -qE 'chunks handed out: [1-9][0-9]* created' "$WORK/status.txt" ||
  fail "the pool handed out no chunks to the replay"

python3 - "$port" <<'EOF'
import re, sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
capacity = re.search(r'^allocd_pool_bytes\{[^}]*state="capacity"[^}]*\} (\S+)', text, re.M)
created = re.search(r'^allocd_pool_chunks_total\{[^}]*origin="created"[^}]*\} (\S+)', text, re.M)
if not capacity or float(capacity.group(1)) <= 0:
    sys.exit("FAIL: /metrics has no allocd_pool_bytes{state=\"capacity\"} > 0")
if not created or float(created.group(1)) <= 0:
    sys.exit("FAIL: /metrics counts no created chunks after the replay")
print(f"metrics: {len(text.splitlines())} lines; pool capacity {float(capacity.group(1)):.0f} bytes, "
      f"{float(created.group(1)):.0f} chunks created")
EOF
phase_done "clients + /metrics"

kill -TERM "$daemon_pid"
status=0
wait "$RUN_PID" || status=$?
RUN_PID=""
cat "$WORK/daemon.log"
[[ $status -eq 0 ]] || fail "after SIGTERM the daemon (buildah run) exited $status, not 0"
for f in "$sock" "$sock.fds"; do
  [[ ! -e "$f" ]] || fail "after SIGTERM $f is still there"
done
grep -q 'shut down' "$WORK/daemon.log" || fail "no 'shut down' line in the daemon's log"
phase_done "SIGTERM"

echo "image test passed; times:"
print_times
