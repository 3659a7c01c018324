#!/bin/bash
# One daemon for every GPU of a node with several (issue 16), on a machine
# with 2 or more GPUs:
#   ddp       a 2-process DDP job (torchrun, NCCL) natively twice, in
#             transparent mode and in advisor mode: each rank's GPU (UUID),
#             losses, peak reserved, step times; the daemon's sessions
#   peaks     two single-GPU jobs with alternating peaks on GPU 1 while the
#             DDP job runs on both: the pools of both GPUs sampled
#   kills     kill -9 of one rank (its chunks back to its GPU's pool); kill -9
#             of the daemon at step 10 (both ranks train on, reconnect)
#   autotune  the DDP job started on max_split_size_mb:64, varying shapes,
#             autotune apply: the decision, its push to each rank, per-rank
#             peaks against the same job run natively
#   whole     issue 40: the job as one, from its first allocation: natively
#             under max_split_size_mb:64, defaults and expandable segments
#             (staying, the best from step 0); with the daemon in apply mode
#             (the default prior), from defaults and from
#             max_split_size_mb:64 in advisor, transparent and
#             unchanged-script modes, then each once more (learned); per
#             rank, each config's first step on it, and the
#             whole-run peak against the best and staying
# Results in OUT (JSON per rank and run, ddp.log; ddp.tgz after each part).
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and the others).
#   [NPROC=2] [WHOLE_STEPS=30] [WHOLE_MODES="advise transparent run"] \
#     [WHOLE_NATIVES="mss64 defaults expandable"] [WHOLE_STARTS="defaults mss64"] \
#     [WHOLE_PASSES="first again"] [WHOLE_PRIOR=learned] \
#     bench/gpu/ddp_validation.sh [BUNDLE] [OUT] [PART...]
# NPROC=1 runs the job as one rank (a one-GPU machine: the autotune part's
# mechanics without the multi-GPU claims). ONE_GPU=1 runs NPROC ranks on GPU 0
# over gloo (the ranks' grouping and promotion on one GPU; not NCCL's).
set -u
bundle=$(cd "${1:-.gpu}" && pwd)
out=${2:-/tmp/allocd-ddp}
shift $(( $# < 2 ? $# : 2 ))
parts=${*:-ddp peaks kills autotune}
mkdir -p "$out"
exec > >(tee -a "$out/ddp.log") 2>&1
here=$(cd "$(dirname "$0")" && pwd)
sock=$out/allocd.sock daemon_log=$out/daemon.log
. "$here/common.sh"
export ALLOCD_SOCKET=$sock NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 OMP_NUM_THREADS=4
ddp() {  # NAME MODE [ARGS...]: a DDP run of NPROC ranks (2), results in $out/NAME_rank*.json, its output in NAME.log
  local name=$1 mode=$2; shift 2
  local one=(); [ "${ONE_GPU:-0}" = 1 ] && one=(--one-gpu)
  timeout 240 ${RUN_PREFIX:-} torchrun --standalone --nproc_per_node "${NPROC:-2}" \
    "$here/ddp_train.py" --mode "$mode" --socket "$sock" --out "$out/$name" "${one[@]}" "$@" \
    >"$out/$name.log" 2>&1
  grep -v -i "warn" "$out/$name.log" | tail -3
}
sample_pools() {  # NAME SECONDS: the daemon's status every second, for SECONDS
  for t in $(seq "$2"); do
    allocctl --json status >"$out/pools_$1_$t.json" 2>/dev/null; sleep 1
  done
}
summary() {  # NAMES...: per rank, what each run did
  python3 - "$out" "${NPROC:-2}" "$@" <<'PY'
import json, statistics, sys
out, nproc, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for name in names:
    for rank in range(nproc):
        try:
            r = json.load(open(f"{out}/{name}_rank{rank}.json"))
        except FileNotFoundError:
            print(f"{name} rank {rank}: no result"); continue
        t = r["step_seconds"][5:] or r["step_seconds"]
        print(f"{name} rank {rank}: {r['uuid']} peak {r['peak_reserved']} "
              f"step median {statistics.median(t)*1e3:.1f} ms, losses {r['losses'][0]:.6f} .. "
              f"{r['losses'][-1]:.6f}, config {r.get('allocd', {}).get('config', '-')!r}")
PY
}

step device
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,memory.used --format=csv | tee "$out/gpu.csv"
python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())"

if want ddp; then
  start_daemon device  # every GPU, each sized from its free memory
  allocctl status
  step "DDP: native, native again (control), transparent, advise (20 steps, 8x512)"
  ddp native native; ddp native2 native
  ( sleep 12; allocctl --json sessions >"$out/sessions_transparent.json" ) &
  ddp transparent transparent --job ddp-t --autotune-mode recommend
  ( sleep 12; allocctl --json sessions >"$out/sessions_advise.json" ) &
  ddp advise advise --job ddp-a --autotune-mode recommend
  summary native native2 transparent advise
  allocctl status
  stop_daemon
  pack ddp
fi

if want peaks; then
  start_daemon device
  step "two jobs on GPU 1 with alternating peaks while DDP runs on both"
  cap1=$(allocctl --json status | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['devices'][1]['capacity_bytes'])")
  peak=$(python3 -c "print(round(int('$cap1') / 2**30 * 0.52))")  # two peaks > GPU 1's pool
  echo "GPU 1 pool $cap1 bytes: peaks of $peak GiB"
  ddp peaks_ddp transparent --job ddp-p --steps 1000 --autotune-mode off &
  ddp_job=$!
  sleep 15
  t0=$(python3 -c "import time; print(time.time() + 8)")
  jobs=()
  for i in 0 1; do
    CUDA_VISIBLE_DEVICES=1 timeout 150 python3 "$here/alternating_peaks.py" --index $i \
      --mode transparent --socket "$sock" --peak-gib "$peak" --start "$t0" \
      --json "$out/peaks_gpu1_$i.json" &
    jobs+=($!)
  done
  sample_pools peaks 40 &
  sampler=$!
  wait "${jobs[@]}" "$ddp_job" "$sampler"
  cat "$out"/peaks_gpu1_*.json; echo
  summary peaks_ddp
  python3 - "$out" <<'PY'
import glob, json, sys
rows = []
for f in sorted(glob.glob(f"{sys.argv[1]}/pools_peaks_*.json"), key=lambda f: int(f.split("_")[-1][:-5])):
    d = json.load(open(f))
    rows.append([(dv.get("gpu_uuid", "")[:12], int(dv.get("in_use_bytes", 0)) >> 30)
                 for dv in d.get("devices", [])])
print("in use per GPU (GiB), each second:", rows)
PY
  stop_daemon
  pack ddp
fi

if want kills; then
  start_daemon device
  step "kill -9 of rank 1 of a transparent DDP job"
  ddp kill_rank transparent --job ddp-k --steps 5000 --autotune-mode off &
  kill_job=$!
  sleep 25
  allocctl --json status >"$out/kill_rank_before.json"
  victim=$(pgrep -f "ddp_train.py --mode transparent" | while read -r p; do
    grep -qz '^LOCAL_RANK=1$' "/proc/$p/environ" 2>/dev/null && echo "$p"; done | head -1)
  echo "rank 1 is pid $victim"; kill -9 "$victim"
  sleep 3
  allocctl --json status >"$out/kill_rank_after.json"
  wait "$kill_job"  # torchrun ends rank 0 too
  python3 - "$out" <<'PY'
import json, sys
for when in ("before", "after"):
    d = json.load(open(f"{sys.argv[1]}/kill_rank_{when}.json"))
    print(when, [(dv.get("gpu_uuid", "")[:12], int(dv.get("in_use_bytes", 0)),
                  int(dv.get("free_bytes", 0)))
                 for dv in d.get("devices", [])])
PY
  step "kill -9 of the daemon at step 10 of 30, restarted 1 s later"
  ddp daemon_killed transparent --job ddp-d --steps 30 --autotune-mode off \
    --kill-daemon-at 10 --daemon-pid "$daemon" \
    --restart-daemon "'$bin/allocd' serve --backend cuda --socket '$sock' --metrics-addr '' 2>>'$out/daemon2.log'"
  summary daemon_killed
  pkill -f "allocd serve --backend cuda --socket $sock"
  pack ddp
fi

if want autotune; then
  step "autotune on DDP: max_split_size_mb:64, varying shapes, 500 steps (the first run, 24 steps, ended before the push reached the second rank): native, then transparent apply"
  PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64 ddp tune_native native --steps 500 --varying
  start_daemon device
  # Each GPU's memory as the driver sees it, every second: the pool never
  # takes what the ranks' own CUDA needs (--headroom).
  nvidia-smi --query-gpu=timestamp,index,memory.used,memory.free --format=csv,noheader \
    -lms 1000 >"$out/smi_tune_transparent.csv" &
  smi=$!
  PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64 ddp tune_transparent transparent --job ddp-tune \
    --steps 500 --varying --autotune-mode apply
  kill "$smi"
  sort -t, -k4 -n "$out/smi_tune_transparent.csv" | head -2 | sed 's/^/least free: /'
  summary tune_native tune_transparent
  allocctl --json autotune history >"$out/autotune_history.json"; allocctl autotune history | tail -8
  python3 - "$out" "${NPROC:-2}" <<'PY'
import json, sys
out = sys.argv[1]
for rank in range(int(sys.argv[2])):
    n = json.load(open(f"{out}/tune_native_rank{rank}.json"))
    t = json.load(open(f"{out}/tune_transparent_rank{rank}.json"))
    switched = next((i for i, c in enumerate(t["step_config"]) if c != t["step_config"][0]), None)
    after = t["step_peak_reserved"][switched + 1:] if switched is not None else []
    native_after = n["step_peak_reserved"][switched + 1:] if switched is not None else []
    print(f"rank {rank}: config {t['step_config'][-1]!r} from step {switched}; peak after it "
          f"{max(after, default=0) / 2**30:.2f} GiB vs native {max(native_after, default=0) / 2**30:.2f} GiB")
PY
  stop_daemon
  pack ddp
fi

if want whole; then
  step "the whole job (issue 40): natives, then apply mode with the default prior"
  steps=${WHOLE_STEPS:-30}
  # The natives (WHOLE_NATIVES: none when an earlier call ran them).
  for native in ${WHOLE_NATIVES-mss64 defaults expandable}; do
    case $native in
      mss64) conf=max_split_size_mb:64 ;; expandable) conf=expandable_segments:True ;; *) conf= ;;
    esac
    PYTORCH_CUDA_ALLOC_CONF=$conf ddp "whole_native_$native" native --steps "$steps" --varying
  done
  # WHOLE_PRIOR=off: no prior at the start, so the first decision's push
  # is what moves every rank off its start config.
  start_daemon device --autotune apply --autotune-prior "${WHOLE_PRIOR:-learned}" \
    --state-dir "$out/state"
  # Every mode from each start, then each once more (the second run starts
  # on what its label learned): whole_MODE[again]_START_rank*.json.
  for pass in ${WHOLE_PASSES:-first again}; do
    again=; [ "$pass" = again ] && again=again
    for start in ${WHOLE_STARTS:-defaults mss64}; do
      conf=; [ "$start" = mss64 ] && conf=max_split_size_mb:64
      for mode in ${WHOLE_MODES:-advise transparent run}; do
        label=ddp-whole-$mode-$start name=whole_$mode${again}_$start
        if [ "$mode" = run ]; then
          PYTORCH_CUDA_ALLOC_CONF=$conf RUN_PREFIX="$bin/allocd run --socket $sock --job $label --" \
            ddp "$name" native --steps "$steps" --varying
        else
          PYTORCH_CUDA_ALLOC_CONF=$conf ddp "$name" "$mode" --job "$label" --steps "$steps" --varying
        fi
      done
    done
  done
  allocctl --json autotune history >"$out/autotune_history.json"; allocctl autotune history | tail -12
  allocctl --json autotune learned >"$out/learned.json" 2>&1
  stop_daemon
  python3 "$here/summarize_ddp_whole.py" "$out" "${NPROC:-2}" | tee "$out/whole_summary.md"
  pack ddp
fi
