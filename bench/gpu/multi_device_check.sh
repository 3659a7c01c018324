#!/bin/bash
# Every GPU of a machine from one daemon: `allocd serve` with its defaults
# (--backend auto, each GPU's capacity its free memory minus --headroom),
# then a client per GPU under CUDA_VISIBLE_DEVICES=i, so that each calls its
# GPU "device 0": the daemon must still serve each from its own GPU's pool,
# matched by UUID. Checks, and prints what it saw:
#  - the daemon found every GPU nvidia-smi lists, same UUIDs, same order
#    (PCI bus order), on the cuda backend;
#  - each GPU's default capacity is its free memory at start minus 1 GiB
#    (within what the daemon's own CUDA context took);
#  - GPU i's pool holds exactly client i's memory, and allocctl sessions
#    puts client i on GPU i's UUID;
#  - allocctl pool trim --device i trims only GPU i.
# One GPU is enough to check the defaults and the UUID match; two or more
# check the routing.
#
#   bench/gpu/multi_device_check.sh BUNDLE   (bench/gpu/make_bundle.sh's)
set -euo pipefail
bundle=$(cd "${1:?usage: multi_device_check.sh BUNDLE}" && pwd)
parts=""
work=$(mktemp -d)
sock=$work/allocd.sock
daemon_log=$work/daemon.log
. "$(dirname "$0")/common.sh"
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT

step "GPUs nvidia-smi lists"
nvidia-smi --query-gpu=index,uuid,pci.bus_id,memory.free --format=csv,noheader |
  tee "$work/smi.csv"
gpus=$(wc -l <"$work/smi.csv")

step "allocd serve with its defaults"
"$bin/allocd" serve --socket "$sock" --metrics-addr '' 2>>"$daemon_log" &
for _ in $(seq 400); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { cat "$daemon_log"; exit 1; }
cat "$daemon_log"
allocctl status

step "a client per GPU, each under CUDA_VISIBLE_DEVICES=i (its device 0)"
for i in $(seq 0 $((gpus - 1))); do
  # GPU i holds (i + 1) GiB.
  CUDA_VISIBLE_DEVICES=$i "$bin/cuda_test_client" hold "$sock" \
      $(( (i + 1) << 30 )) >"$work/client.$i" 2>&1 &
done
for i in $(seq 0 $((gpus - 1))); do
  for _ in $(seq 600); do grep -q ready "$work/client.$i" && break; sleep 0.05; done
  grep -q ready "$work/client.$i" || { cat "$work/client.$i"; exit 1; }
done
allocctl status
allocctl sessions
allocctl --json status >"$work/status.json"
allocctl --json sessions >"$work/sessions.json"

python3 - "$work" <<'EOF'
import csv, json, sys
work = sys.argv[1]
smi = [[f.strip() for f in row] for row in csv.reader(open(f"{work}/smi.csv"))]
status = json.load(open(f"{work}/status.json"))
sessions = json.load(open(f"{work}/sessions.json")).get("sessions", [])
devices = status.get("devices", [])
GiB = 1 << 30
ok = True
def check(cond, what):
    global ok
    print(("ok   " if cond else "FAIL ") + what)
    ok &= bool(cond)
check(status["backend"] == "cuda", f"backend {status['backend']} (auto found the GPUs)")
check([d["gpu_uuid"] for d in devices] == [row[1] for row in smi],
      "the daemon's devices are nvidia-smi's, same UUIDs, same order")
for i, d in enumerate(devices):
    held = int(d.get("in_use_bytes", 0))
    check(held == (i + 1) * GiB, f"GPU {i} pool holds {held / GiB:.2f} GiB, its client's {i + 1} GiB")
    cap = int(d["capacity_bytes"])
    print(f"     GPU {i}: capacity {cap / GiB:.2f} GiB (free at start minus 1 GiB headroom; "
          f"nvidia-smi said {smi[i][3]} free before the daemon started)")
    mine = [s for s in sessions if s.get("gpu_uuid") == d["gpu_uuid"]]
    check(len(mine) == 1 and int(mine[0].get("held_bytes", 0)) == (i + 1) * GiB
          and int(mine[0].get("device", 0)) == 0,
          f"one session on {d['gpu_uuid']} (its client's own ordinal 0), holding {i + 1} GiB")
sys.exit(0 if ok else 1)
EOF

step "allocctl pool trim --device: only that GPU"
kill $(jobs -p | tail -n "$gpus") 2>/dev/null || true
sleep 1
allocctl pool trim --device 0
allocctl status
kill $(jobs -p) 2>/dev/null || true
wait 2>/dev/null || true
