# Sourced by the GPU scripts (run_validation.sh, transparent_validation.sh,
# autotune_validation.sh) after they set `bundle`, `parts`, `sock` and
# `daemon_log`:
# the bundle's libraries and Python package on the paths, except what the
# system has (Python's own SSL and zlib), and the helpers they share.
: "${bundle:?common.sh: set bundle (the bundle folder) before sourcing it}"
for l in libssl.so.3 libcrypto.so.3 libz.so.1; do
  ldconfig -p | grep -q "$l " && rm -f "$bundle/lib/$l"
done
export LD_LIBRARY_PATH=$bundle/lib PYTHONPATH=$bundle/python ALLOCD_LIB_DIR=$bundle/python/allocd
bin=$bundle/bin
# The bundle's strace, where make_bundle.sh found one (overhead.py --syscall-steps).
if [ -x "$bin/strace" ]; then export ALLOCD_STRACE=$bin/strace; fi
step() { echo; echo "=== $(date -u +%T) $*"; }
want() { [[ " $parts " == *" $1 "* ]]; }
allocctl() { "$bin/allocctl" --socket "$sock" "$@"; }
# start_daemon [CAPACITY [SERVE FLAGS...]]: `allocd serve --backend cuda` on
# $sock (CAPACITY: default $CAPACITY, else 76GiB; `device`: no --capacity,
# every GPU sized from its free memory), its log appended to $daemon_log;
# returns once the socket is there. stop_daemon: SIGTERM, wait.
start_daemon() {
  local capacity=${1:-${CAPACITY:-76GiB}}
  shift $(( $# > 0 ? 1 : 0 ))
  local sizing=(--capacity "$capacity")
  [ "$capacity" = device ] && sizing=()
  "$bin/allocd" serve --backend cuda --socket "$sock" --metrics-addr '' \
      "${sizing[@]}" "$@" 2>>"$daemon_log" &
  daemon=$!
  for _ in $(seq 200); do [ -S "$sock" ] && return 0; sleep 0.05; done
  echo "allocd serve did not start:"; cat "$daemon_log"; exit 1
}
stop_daemon() { kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; }
# pack NAME: everything in $out so far as $out/NAME.tgz, for machines that
# return few files; called after each part, so a run cut short still returns
# what it measured.
# (tar's 1, a log written meanwhile, is no failure of the part.)
pack() {
  (cd "$out" && tar czf "$1.tgz" --warning=no-file-changed --exclude '*.tgz' \
     --exclude '*.sock*' --exclude '*.fds' .) || [ $? -eq 1 ]
}
