#!/bin/bash
# A daemon restart on a real GPU (issue 14, deliver 4): the CUDA path of
# re-declaring and adopting chunks, which CI's sim test (tests/server/
# restart_test) cannot run.
#   restart   three transparent jobs allocate and free 64-512 MiB tensors
#             (up to 12 GiB each); the daemon is killed with SIGKILL and
#             restarted; a fourth job starts at once (its memory waits for
#             the survivors to re-declare). Then the load pauses and the
#             daemon's books (allocctl sessions/status) are compared with
#             each job's torch.cuda.memory_reserved(): they must be equal,
#             per job and in total; nvidia-smi's used memory is logged.
#   capacity  a native process takes 20 GiB, then the daemon starts with a
#             capacity above what is left: its log must say it clipped the
#             capacity, and allocctl status must show the clipped value.
# Results in OUT (restart.log, JSON per job, daemon logs).
#   bench/gpu/restart_validation.sh [BUNDLE] [OUT] [PART...]
set -u
bundle=$(cd "${1:-.gpu}" && pwd)
out=${2:-/tmp/allocd-restart}
shift $(( $# < 2 ? $# : 2 ))
parts=${*:-restart capacity}
mkdir -p "$out"
exec > >(tee -a "$out/restart.log") 2>&1
here=$(cd "$(dirname "$0")" && pwd)
sock=$out/allocd.sock daemon_log=$out/daemon.log
. "$here/common.sh"

step device
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$out/gpu.csv"

used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }

if want restart; then
  rm -f "$sock.sessions"
  start_daemon 60GiB
  step "three transparent jobs under load"
  jobs=()
  for i in 1 2 3; do
    "$bin/allocd" run --socket "$sock" -- python "$here/restart_holder.py" --gib 12 --seed $i \
      >"$out/holder$i.json" 2>"$out/holder$i.err" &
    jobs+=($!)
  done
  for i in 1 2 3; do
    for _ in $(seq 600); do grep -q ready "$out/holder$i.json" && break; sleep 0.1; done
  done
  sleep 5
  allocctl status | tee "$out/status_before.txt"
  echo "GPU used before the kill: $(used_mib) MiB"
  step "kill -9 of the daemon; restart"
  kill -9 "$daemon"; wait "$daemon" 2>/dev/null
  sleep 1
  daemon_log=$out/daemon2.log start_daemon 60GiB
  restarted=$(date +%s.%N)
  "$bin/allocd" run --socket "$sock" -- python "$here/working_set.py" --mode transparent \
    --socket "$sock" --gib 4 --json "$out/newcomer.json" >"$out/newcomer.out" 2>&1 &
  newcomer=$!
  for _ in $(seq 300); do
    allocctl --json status | grep -q '"adopting": true' || break
    sleep 0.1
  done
  echo "adoption window closed $(python3 -c "import sys; print(round(float(sys.argv[1]) - float(sys.argv[2]), 2))" "$(date +%s.%N)" "$restarted") s after the restart"
  grep -E "restarted with|re-declared|not adopted|more than the device" "$out/daemon2.log"
  wait "$newcomer"; echo "newcomer: $(cat "$out/newcomer.json" 2>/dev/null)"
  sleep 2
  step "pause the load; the daemon's books against each job's reserved bytes"
  kill -USR1 "${jobs[@]}"  # `allocd run` execs: these are the Python processes
  sleep 3
  allocctl --json sessions >"$out/sessions_after.json"
  allocctl --json status | tee "$out/status_after.json"
  echo "GPU used after: $(used_mib) MiB"
  python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
sessions = json.load(open(f"{out}/sessions_after.json")).get("sessions", [])
held = {s["pid"]: int(s.get("held_bytes", 0)) for s in sessions}
status = json.load(open(f"{out}/status_after.json"))
ok, total = True, 0
for i in (1, 2, 3):
    lines = [json.loads(l) for l in open(f"{out}/holder{i}.json") if l.strip()]
    last = lines[-1]
    if "reserved" not in last:
        print(f"job {i}: no report: {last}"); ok = False; continue
    daemon = held.get(last["pid"])
    total += last["reserved"]
    print(f"job {i} pid {last['pid']}: reserved {last['reserved']}, daemon says {daemon}")
    ok &= daemon == last["reserved"]
in_use = int(status.get("in_use_bytes", 0))
print(f"total reserved {total}, daemon in use {in_use}, adopted {status.get('adopted_bytes_total')}")
print("EXACT" if ok and in_use == total else "MISMATCH")
PY
  kill "${jobs[@]}" 2>/dev/null; wait "${jobs[@]}" 2>/dev/null
  stop_daemon
fi

if want capacity; then
  step "capacity above the device's free memory is clipped"
  python -c "
import torch, signal
x = torch.empty(20 << 30, dtype=torch.uint8, device='cuda')
print('holding 20 GiB natively', flush=True)
signal.sigwait({signal.SIGTERM})" &
  hog=$!
  sleep 8
  rm -f "$sock.sessions"
  daemon_log=$out/daemon_clip.log start_daemon 76GiB
  sleep 1
  grep "more than the device" "$out/daemon_clip.log" || echo "NO CLIP WARNING"
  allocctl status
  stop_daemon
  kill -9 "$hog"; wait "$hog" 2>/dev/null || true
fi
