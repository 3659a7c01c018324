#!/bin/bash
# allocd on a real GPU, end to end (issue: managed mode proven on the H100):
#   1. tests/gpu/cuda_chunks_test and the chunk acquire benchmark;
#   2. the llama_lora workload under native PyTorch and allocd managed mode,
#      each with the default config and with expandable_segments:True:
#      losses, step time, peak reserved, the GPU's used memory;
#   3. malloc+free through PyTorch, native vs allocd;
#   4. two jobs with alternating peaks that together exceed the GPU;
#   5. kill -9 of the daemon mid-training (restarted 1 s later), and
#      kill -9 of a job (its memory back in the pool);
#   6. step time at a fixed shape, native and allocd runs alternating.
# Results: OUT/validation.json (all numbers), OUT/validation.log and the
# raw files in OUT/raw.
#
#   bench/gpu/run_validation.sh [BUNDLE] [OUT] [PART...]
#
# PARTS: tests train malloc peaks kills steptime (default: all), and compat
# (engine mode vs native: OUT/engine_compat.json; only when named). A part run later
# into the same OUT adds to the same summary, so the validation can be split
# over several shorter sessions.
#
# BUNDLE (default .gpu) holds bin/ (allocd, allocctl, cuda_chunks_test,
# cuda_test_client, cuda_chunk_bench), python/ (the built package with
# liballocd_torch.so) and lib/ (their shared libraries for a machine without
# the build's packages: ../shared/tools/bundle-libs.sh BUNDLE/lib ...).
# Run from the repository root on a machine with one idle GPU.
set -u
bundle=$(cd "${1:-.gpu}" && pwd)
out=${2:-${OUT:-/tmp/allocd-validation}}
shift $(( $# < 2 ? $# : 2 ))
parts=${*:-tests train malloc peaks kills steptime}
work=$out/raw
mkdir -p "$work"
exec > >(tee -a "$out/validation.log") 2>&1
here=$(cd "$(dirname "$0")" && pwd)
sock=$work/allocd.sock daemon_log=$work/daemon.log
. "$here/common.sh"


step device
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$work/gpu.csv"
python -c "import torch; print('torch', torch.__version__)"

if want tests; then
step "tests/gpu/cuda_chunks_test"
ALLOCD_BINARY=$bin/allocd ALLOCCTL_BINARY=$bin/allocctl CUDA_TEST_CLIENT_BINARY=$bin/cuda_test_client \
  timeout 300 "$bin/cuda_chunks_test" --gtest_output=json:"$work/cuda_chunks_test.json" | tail -4
step "cuda_chunk_bench (acquire through the daemon)"
timeout 240 "$bin/cuda_chunk_bench" --allocd "$bin/allocd" --iterations 2000 --out "$work/cuda_chunk_bench.json" | tail -8

fi

if want train; then
step "llama_lora: native defaults"
timeout 400 python "$here/llama_lora_train.py" --mode native --json "$work/train_native.json" | cut -c1-300
step "llama_lora: native expandable_segments:True"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 400 \
  python "$here/llama_lora_train.py" --mode native --json "$work/train_native_expandable.json" | cut -c1-300
step "llama_lora: allocd managed"
start_daemon
timeout 400 python "$here/llama_lora_train.py" --mode allocd --socket "$sock" --json "$work/train_allocd.json" | cut -c1-300
step "llama_lora: allocd managed, expandable_segments:True"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 400 \
  python "$here/llama_lora_train.py" --mode allocd --socket "$sock" --json "$work/train_allocd_expandable.json" | cut -c1-300
allocctl status
stop_daemon
fi

if want malloc; then
start_daemon
step "malloc+free: native, allocd"
timeout 200 python "$here/malloc_bench.py" --mode native --json "$work/malloc_native.json"
timeout 200 python "$here/malloc_bench.py" --mode allocd --socket "$sock" --json "$work/malloc_allocd.json"

stop_daemon
fi

if want peaks; then
start_daemon
step "two jobs, alternating 44 GiB peaks: native, then allocd"
for mode in native allocd; do
  t0=$(python -c "import time; print(time.time() + 8)")
  pids=()
  for i in 0 1; do
    timeout 120 python "$here/alternating_peaks.py" --index $i --mode $mode --socket "$sock" \
      --start "$t0" --json "$work/peaks_${mode}_$i.json" &
    pids+=($!)
  done
  wait "${pids[@]}"
done
allocctl sessions
grep -i "reclaim\|refus\|oom" "$work/daemon.log" | tail -12 | cut -c1-240
stop_daemon
fi

if want steptime; then
start_daemon
step "step time: fixed shape 4x512, 60 steps, native and allocd alternating, 3 runs each"
for i in 1 2 3; do
  for mode in native allocd; do
    timeout 300 python "$here/llama_lora_train.py" --mode $mode --socket "$sock" --steps 60 \
      --shape 4x512 --json "$work/step_${mode}_$i.json" >/dev/null
  done
done
stop_daemon
fi

if want kills; then
start_daemon
step "kill -9 of the daemon at step 10 of 30, restarted 1 s later"
timeout 400 python "$here/llama_lora_train.py" --mode allocd --socket "$sock" \
  --kill-daemon-at 10 --daemon-pid "$daemon" \
  --restart-daemon "'$bin/allocd' serve --backend cuda --socket '$sock' --metrics-addr '' --capacity ${CAPACITY:-76GiB} 2>>'$work/daemon2.log'" \
  --json "$work/train_allocd_daemon_killed.json" | cut -c1-300
daemon=$(pgrep -f "allocd serve --backend cuda --socket $sock" | head -1)
tail -3 "$work/daemon2.log"
allocctl status

step "kill -9 of a job holding 20 GiB"
python - "$sock" >"$work/holder.out" 2>&1 <<'PY' &
import sys, time, torch, allocd
allocd.enable(socket=sys.argv[1], job="holder", required=True)
x = torch.ones(20 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(600)
PY
holder=$!
for _ in $(seq 600); do grep -q ready "$work/holder.out" && break; sleep 0.1; done
allocctl --json status >"$work/kill_before.json"; allocctl status
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits >"$work/kill_used_before"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
kill -9 $holder; wait $holder 2>/dev/null
sleep 1
allocctl --json status >"$work/kill_after.json"; allocctl status
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits >"$work/kill_used_after"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
stop_daemon
sleep 1
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits >"$work/used_daemon_stopped"
fi

if want compat; then
step "engine mode vs native PyTorch (bench/gpu/engine_compat.py)"
python "$here/engine_compat.py" --allocd "$bin/allocd" --workdir "$work/engine_compat" \
    >"$out/engine_compat.json" || echo "engine_compat: some checks failed"
python -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["summary"]))' \
    "$out/engine_compat.json"
fi

step summary
python "$here/summarize_validation.py" "$work" "$out/validation.json"
tail -5 "$work/daemon.log"
