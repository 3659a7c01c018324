#!/bin/bash
# No memory crosses tenants on a real GPU (issue 29, deliver 9), as root on
# the GPU machine (the jobs run as uids 1001 and 1002; the daemon's tenancy
# is the default, uid):
#   remanence  the two-job check: job A (uid 1001) writes 0xA5 into GIB GiB
#              of tensors (remanence_job.py), then exits or releases them and
#              lives on; job B (uid 1002) allocates GIB GiB with torch.empty
#              and counts A's bytes. Every path daemon-held memory takes:
#                client    the defaults (the process makes its chunks)
#                daemon    ALLOCD_CLIENT_CREATES=0 for both (the daemon makes
#                          them and caches them when A is done)
#                handover  daemon-made, and B registers under A's job label
#                          (its working set handed over, read ahead)
#                shared    A keeps its tensors and hands B a CUDA IPC handle
#                          (torch.multiprocessing's reduction): B's open must
#                          be refused; then B allocates
#                reclaim   A frees its tensors into PyTorch's cache and
#                          lives on; B takes all but 2 GiB of CAPACITY, so
#                          the daemon must reclaim A's idle cache (A keeps
#                          the freed segments as spares and gives them back)
#              Target: 0 pattern bytes in every B.
#   control    the same as `daemon` and `reclaim` with A and B both uid
#              1001: one tenant reuses as before (B reads A's pattern: the
#              check can see it)
# Each case starts a fresh daemon. Results in OUT: NAME/a.json and b.json
# per case, remanence.json (the summary), tenancy.log, and all of it
# in tenancy.tgz after each part.
#   bench/gpu/tenancy_validation.sh [BUNDLE] [OUT] [PART...]
# GIB (default 4) and CAPACITY (default 24GiB) from the environment.
set -u
bundle=$(cd "${1:-.gpu}" && pwd)
out=${2:-/tmp/allocd-tenancy}
shift $(( $# < 2 ? $# : 2 ))
parts=${*:-remanence control}
gib=${GIB:-4}
mkdir -p "$out"
chmod 0755 "$out"
exec > >(tee -a "$out/tenancy.log") 2>&1
here=$(cd "$(dirname "$0")" && pwd)
sock=$out/allocd.sock daemon_log=$out/daemon.log
CAPACITY=${CAPACITY:-24GiB}
. "$here/common.sh"
export ALLOCD_SOCKET=$sock
python=$(command -v python)
daemon=""

step device
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$out/gpu.csv"
[ "$(id -u)" = 0 ] || { echo "run as root: the jobs run as uids 1001 and 1002"; exit 1; }

# The daemon, its sockets open to the jobs' uids.
fresh_daemon() {
  stop_daemon 2>/dev/null
  rm -f "$sock" "$sock.fds"
  start_daemon
  for _ in $(seq 100); do [ -S "$sock.fds" ] && break; sleep 0.05; done
  chmod 0666 "$sock" "$sock.fds"
}
# as UID ARGS...: remanence_job.py ARGS under `allocd run`, as UID (its own
# HOME), the environment kept.
as() {
  local uid=$1; shift
  mkdir -p "$out/home_$uid" && chown "$uid:$uid" "$out/home_$uid"
  HOME=$out/home_$uid setpriv --reuid="$uid" --regid="$uid" --clear-groups \
    "$bin/allocd" run --socket "$sock" -- "$python" "$here/remanence_job.py" "$@"
}
# check NAME END A_UID B_UID [VAR=VALUE...]: one two-job check, the
# variables set for both jobs; the jobs' files in OUT/NAME.
check() {
  local name=$1 end=$2 a_uid=$3 b_uid=$4; shift 4
  step "$name: A (uid $a_uid) writes $gib GiB and ends by $end; B (uid $b_uid) reads"
  fresh_daemon
  local dir=$out/$name
  rm -rf "$dir" && mkdir -p "$dir" && chmod 0777 "$dir"
  # A in a process group of its own, ended whole when B is done.
  (if [ $# -gt 0 ]; then export "$@"; fi
   exec setsid bash -c "$(declare -f as); out=$out sock=$sock bin=$bin \
     python=$python here=$here; as $a_uid writer --gib $gib --end $end \
     --ready $dir/ready --share-file $dir/share --json $dir/a.json") &
  local a=$!
  for _ in $(seq 1200); do
    [ -e "$dir/ready" ] && break
    kill -0 "$a" 2>/dev/null || break
    sleep 0.1
  done
  [ "$end" = exit ] && wait "$a"
  local share_arg="" b_gib=$gib
  [ "$end" = share ] && share_arg="--share-file $dir/share"
  # More than the pool has free while A caches its GIB: A's cache must go.
  [ "$end" = cache ] && b_gib=$(( ${CAPACITY%GiB} - 2 ))
  (if [ $# -gt 0 ]; then export "$@"; fi
   as "$b_uid" reader --gib "$b_gib" $share_arg --json "$dir/b.json")
  if [ "$end" = cache ]; then  # A writes what the reclaim left it
    kill -USR1 "$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["pid"])' \
      "$dir/a.json")" 2>/dev/null && sleep 2
    grep -i "reclaim" "$daemon_log" | tail -3
  fi
  kill -TERM -- "-$a" 2>/dev/null; wait "$a" 2>/dev/null
  stop_daemon
  pack tenancy
}

if want remanence; then
  check client_exit exit 1001 1002
  check client_release release 1001 1002
  check daemon_exit exit 1001 1002 ALLOCD_CLIENT_CREATES=0
  check daemon_release release 1001 1002 ALLOCD_CLIENT_CREATES=0
  check handover_exit exit 1001 1002 ALLOCD_CLIENT_CREATES=0 ALLOCD_JOB=train-a
  check handover_release release 1001 1002 ALLOCD_CLIENT_CREATES=0 ALLOCD_JOB=train-a
  check shared share 1001 1002 ALLOCD_CLIENT_CREATES=0 ALLOCD_INTERPOSE_VERBOSE=1
  check client_reclaim cache 1001 1002
  check daemon_reclaim cache 1001 1002 ALLOCD_CLIENT_CREATES=0
fi
if want control; then
  check control_same_tenant exit 1001 1001 ALLOCD_CLIENT_CREATES=0
  check control_reclaim cache 1001 1001
fi
if want remanence || want control; then
  step summary
  python - "$out" <<'EOF' | tee "$out/remanence.json"
import glob, json, os, sys
out = sys.argv[1]
cases = {}
for b in sorted(glob.glob(os.path.join(out, "*", "b.json"))):
    name = os.path.basename(os.path.dirname(b))
    r = json.load(open(b))
    case = {k: r.get(k) for k in ("uid", "bytes", "pattern_bytes",
                                   "nonzero_bytes", "pattern_fraction")}
    if "share" in r:
        case["share"] = r["share"]
    a = os.path.join(out, name, "a.json")
    if os.path.exists(a):
        writer = json.load(open(a))
        case["writer_uid"] = writer.get("uid")
        if "after_reader" in writer:  # the reclaim case: what A kept
            case["writer_after_reader"] = writer["after_reader"]
    crossed = case["writer_uid"] != case["uid"]
    leaked = (r.get("pattern_bytes") or 0) > 0 or \
        (r.get("share") or {}).get("opened", False)
    case["verdict"] = ("LEAK" if leaked else "ok") if crossed else \
        ("reused as before" if leaked else "not reused")
    cases[name] = case
print(json.dumps(cases, indent=2))
EOF
  pack tenancy
fi
