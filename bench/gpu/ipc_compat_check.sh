#!/bin/bash
# A job that shares CUDA tensors with a consumer that cannot pidfd_getfd it
# keeps working after allocd's autotuner decides (issue 40, deliver 2;
# docs/compatibility.md). Needs root (the consumer runs as another uid or in
# another PID namespace) and one GPU; a few minutes.
#   control_off   natively, expandable segments off throughout: shows
#                 that the consumer can open shared tensors at all
#   control_es    natively, expandable segments turned on at step 10 (what
#                 the autotuner must never do): the consumer is expected to
#                 fail from then on with "pidfd_getfd" (another uid) or
#                 "pidfd_open" (another PID namespace)
#   allocd        under allocd.advise() with the daemon in apply mode, the
#                 job started on max_split_size_mb:64 (which the autotuner
#                 otherwise replaces with expandable segments at
#                 registration), declaring ALLOCD_FEATURES=cuda_ipc: every
#                 tensor opens, the job's features say cuda_ipc, and the
#                 decisions list expandable segments as left out
# Each part runs twice: the consumer as uid 65534 (CONSUMER=uid) and as root
# in a PID namespace of its own (CONSUMER=pidns, the "another pod" case).
# Results in OUT: one JSON per part and consumer, `autotune history` and
# `autotune status` of the allocd part, ipc_compat.log; a summary at the end.
#   bench/gpu/ipc_compat_check.sh [BUNDLE] [OUT] [PART...]
set -u
bundle=$(cd "${1:-.gpu}" && pwd)
out=${2:-/tmp/allocd-ipc-compat}
shift $(( $# < 2 ? $# : 2 ))
parts=${*:-control_off control_es allocd}
mkdir -p "$out"
exec > >(tee -a "$out/ipc_compat.log") 2>&1
here=$(cd "$(dirname "$0")" && pwd)
sock=$out/allocd.sock daemon_log=$out/daemon.log
. "$here/common.sh"
[ "$(id -u)" = 0 ] || { echo "needs root: the consumer runs as another uid"; exit 1; }
# The consumer of another uid must read the script and the bundle.
job=/tmp/ipc_compat_check.py
cp "$here/ipc_compat_check.py" "$job" && chmod 0644 "$job"
chmod -R a+rX "$bundle" 2>/dev/null
chmod a+rwx "$out"

step device
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python -c "import torch; print('torch', torch.__version__)"

# run NAME CONSUMER PRODUCER-ARGS...: the consumer started as CONSUMER,
# then the producer with its args; both end with the producer.
run() {
  local name=$1 consumer=$2; shift 2
  local address=$out/$name-$consumer.ipc
  rm -f "$address"
  step "$name, consumer: $consumer"
  python "$job" produce --address "$address" --json "$out/$name-$consumer.json" "$@" &
  local producer=$!
  for _ in $(seq 200); do [ -S "$address" ] && break; sleep 0.05; done
  case $consumer in
    uid) setpriv --reuid=65534 --regid=65534 --clear-groups \
           env HOME=/tmp python "$job" consume --address "$address" ;;
    pidns) unshare --pid --fork --mount-proc python "$job" consume --address "$address" ;;
  esac
  wait "$producer"
}

for consumer in ${CONSUMER:-uid pidns}; do
  want control_off && run control_off "$consumer"
  want control_es && run control_es "$consumer" --expandable-at 10
  if want allocd; then
    start_daemon 60GiB --autotune apply
    PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64 ALLOCD_FEATURES=cuda_ipc run allocd "$consumer" \
      --socket "$sock" --job "ipc-$consumer"
    allocctl autotune history --job "ipc-$consumer" > "$out/allocd-$consumer.history.txt"
    allocctl --json autotune history --job "ipc-$consumer" > "$out/allocd-$consumer.history.json"
    allocctl --json autotune status > "$out/allocd-$consumer.status.json"
    stop_daemon
  fi
done

step summary
python - "$out" $parts <<'PY'
import glob, json, os, sys
out, parts = sys.argv[1], sys.argv[2:]
ok = True
# A part that left no result (its job failed before writing one) fails.
for part in parts:
    if not [p for p in glob.glob(os.path.join(out, f"{part}-*.json"))
            if not p.endswith((".history.json", ".status.json"))]:
        print(f"{part:22s} no result: see ipc_compat.log")
        ok = False
for path in sorted(glob.glob(os.path.join(out, "*-*.json"))):
    name = os.path.basename(path)[:-5]
    if name.endswith((".history", ".status")):
        continue
    r = json.load(open(path))
    part = name.split("-")[0]
    expect_all = part in ("control_off", "allocd")
    good = r["opened"] == r["shared"] if expect_all else r["opened"] < r["shared"]
    ok &= good or part == "control_es"
    print(f"{name:22s} opened {r['opened']}/{r['shared']} {'ok' if good else 'UNEXPECTED'} "
          f"{r['errors'][:1]}")
    if part == "allocd":
        configs = sorted({s.get("allocd_config") or "" for s in r["steps"]})
        print(f"{'':22s} configs the producer ran: {configs}")
        ok &= not any("expandable_segments:True" in c for c in configs)
        hist = json.load(open(path.replace(".json", ".history.json")))
        left = [l["config"] for d in hist.get("decisions", []) for l in d.get("left_out", [])]
        print(f"{'':22s} {len(hist.get('decisions', []))} decisions; left out: {left[:3]}")
print("PASS" if ok else "FAIL")
PY
