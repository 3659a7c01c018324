#!/bin/bash
# Transparent managed mode on a real GPU (issue 13, deliver 3 and 5):
#   compat     transparent_compat.py natively and under `allocd run`, with
#              PyTorch's defaults and with expandable segments
#   train      llama_lora and resnet (not llama-like), deterministic, natively
#              twice and transparent: losses, peak reserved, nvidia-smi's
#              used memory
#   steptime   a fixed, GPU-bound shape, 5 interleaved rounds of native and
#              transparent with the stream from the C++ tracker, from
#              PyTorch's history and none (autotune recommend: no push)
#   tracker    tracker_check.py: the tracker built against this PyTorch, its
#              stream against PyTorch's history, its cost per event
#   workset    a 40 GiB working set: 3 interleaved native / transparent
#              cold without read-ahead (ALLOCD_READ_AHEAD_MS=0; the process
#              makes the chunks) / cold reading ahead (the default) / cold
#              with the daemon creating them (ALLOCD_CLIENT_CREATES=0, which
#              leaves them cached) / warm (from that cache) / warm reading
#              ahead / warm with the job's last working set handed over (the
#              default; the others run ALLOCD_HANDOVER_MS=0), and
#              cuda_chunk_bench's working set each way (WORKSET_TRIPLES
#              triples, 3 by default)
#   peaks      two jobs with alternating 44 GiB peaks, transparent
#   kills      kill -9 of a transparent job holding 20 GiB; kill -9 of the
#              daemon mid-training
#   handover   llama_lora (deterministic, 30 steps) natively, then
#              transparent three times: a first run whose chunks the daemon
#              makes (ALLOCD_CLIENT_CREATES=0: they stay cached when it ends),
#              the next handed that run's working set from the cache (the
#              defaults), and one more without the handover
#              (ALLOCD_HANDOVER_MS=0); the pool's counters after each
#   trim       (issue 14) a job that comes back to a warm pool and to one
#              `allocctl pool trim` emptied, 2 interleaved pairs: the model
#              put on the GPU and the first step, against the chunks the
#              trimmed pool had to create; then the daemon's own trim
#              (--trim-after 20s) of an idle node, with nvidia-smi's view
# Results in OUT (JSON per run, transparent.log, all of it in
# transparent.tgz after each part).
#   bench/gpu/transparent_validation.sh [BUNDLE] [OUT] [PART...]
set -u
bundle=$(cd "${1:-.gpu}" && pwd)
out=${2:-/tmp/allocd-transparent}
shift $(( $# < 2 ? $# : 2 ))
parts=${*:-compat train tracker steptime workset peaks kills handover trim}
mkdir -p "$out"
exec > >(tee -a "$out/transparent.log") 2>&1
here=$(cd "$(dirname "$0")" && pwd)
sock=$out/allocd.sock daemon_log=$out/daemon.log
. "$here/common.sh"
export ALLOCD_SOCKET=$sock
run_t() { "$bin/allocd" run --socket "$sock" -- "$@"; }

step device
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$out/gpu.csv"
python -c "import torch; print('torch', torch.__version__)"

if want compat; then
  start_daemon 16GiB
  step "compat: native"; timeout 200 python "$here/transparent_compat.py" --json "$out/compat_native.json"
  step "compat: transparent"; run_t timeout 200 python "$here/transparent_compat.py" --json "$out/compat_transparent.json"
  only=training_step,memory_stats_family,record_history_and_snapshot,out_of_memory_error,cuda_graph_capture,torch_compile_reduce_overhead,empty_cache_and_mem_get_info
  step "compat: native, expandable"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 200 python "$here/transparent_compat.py" --only $only --json "$out/compat_native_expandable.json"
  step "compat: transparent, expandable"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True run_t timeout 200 python "$here/transparent_compat.py" --only $only --json "$out/compat_transparent_expandable.json"
  if [ -f "$here/engine_compat.py" ]; then
    step "compat: engine"; timeout 200 python "$here/engine_compat.py" --socket "$sock" --json "$out/compat_engine.json"
  fi
  stop_daemon
  pack transparent
fi

if want train; then
  start_daemon
  # --deterministic: runs of one seed are bit-identical natively (the native
  # control shows it), so transparent's losses and peaks can be compared bit
  # for bit; recommend: the autotuner decides, pushes nothing (same config).
  for workload in llama_lora resnet; do
    # transparent_again: the job's second run, handed the first's working
    # set (mapped from the daemon's cache while it starts).
    for run in native native_control transparent transparent_again; do
      step "$workload: $run (deterministic)"
      timeout 300 python "$here/${workload}_train.py" --mode ${run%%_*} --socket "$sock" \
        --deterministic $([ ${run%%_*} = transparent ] && echo --autotune-mode recommend) \
        --json "$out/train_${workload}_$run.json" | cut -c1-200
    done
  done
  allocctl status
  stop_daemon
  pack transparent
fi

if want steptime; then
  start_daemon
  # GPU-bound (8x1024: ~16k tokens a step) and nothing else sampling the
  # driver (no nvidia-smi thread); transparent records and the autotuner
  # decides, but pushes nothing, so every run is on PyTorch's defaults.
  # The allocation stream three ways: transparent (the C++ tracker),
  # transparent_history (PyTorch's history, what the tracker replaces),
  # transparent_norec (none). STEP_PAIRS (5) rounds of native and
  # STEP_MODES (the three), STEP_STEPS (50) steps each; the median and the
  # mean of steps 10 on.
  pairs=${STEP_PAIRS:-5} steps=${STEP_STEPS:-50}
  modes=${STEP_MODES:-transparent transparent_history transparent_norec}
  step "step time: 8x1024, $steps steps, $pairs interleaved rounds of native / ${modes// / / }"
  for i in $(seq "$pairs"); do
    for mode in native $modes; do
      extra=() source=tracker
      [ $mode = transparent_norec ] && extra=(--no-record-events)
      [ $mode = transparent_history ] && source=history
      ALLOCD_EVENT_SOURCE=$source timeout 200 python "$here/llama_lora_train.py" \
        --mode ${mode%%_*} --socket "$sock" --steps "$steps" --shape 8x1024 --smi-period 0 \
        --autotune-mode recommend "${extra[@]}" --json "$out/step_${mode}_$i.json" >/dev/null
    done
    pack transparent  # a run cut short keeps the rounds it finished
  done
  python - "$out" "$pairs" $modes <<'PY'
import json, statistics, sys
out, pairs, modes = sys.argv[1], int(sys.argv[2]), tuple(sys.argv[3:])
ratios = {m: {"median": [], "mean": []} for m in modes}
for i in range(1, pairs + 1):
    runs = {m: json.load(open(f"{out}/step_{m}_{i}.json")) for m in ("native",) + modes}
    steady = {m: r["step_seconds"][10:] for m, r in runs.items()}
    line = f"round {i}: native {statistics.median(steady['native'])*1e3:.1f} ms"
    for m in modes:
        for kind, f in (("median", statistics.median), ("mean", statistics.mean)):
            ratios[m][kind].append(f(steady[m]) / f(steady["native"]))
        info = runs[m].get("allocd", {})
        line += (f", {m} {ratios[m]['median'][-1]:.4f}/{ratios[m]['mean'][-1]:.4f}"
                 f" ({info.get('event_source')}, advisor busy {info.get('advisor_seconds', 0):.2f} s)")
    print(line)
for m, r in ratios.items():
    for kind, v in r.items():
        print(f"{m}/native, {kind} step: median of rounds {statistics.median(v):.4f}, "
              f"spread {min(v):.4f}-{max(v):.4f}")
PY
  stop_daemon
  pack transparent
fi

if want tracker; then
  step "the C++ allocation-stream tracker: built against this PyTorch, its stream against PyTorch's history, cost per event"
  timeout 600 python "$here/tracker_check.py" --json "$out/tracker_check.json"
  pack transparent
fi

if want workset; then
  start_daemon
  step "40 GiB working set: 3 interleaved native / transparent cold / cold reading ahead / cold, the daemon creating / warm / warm reading ahead / warm, handed over, each process 3 rounds"
  export ALLOCD_HANDOVER_MS=0  # but for the last run of each triple
  for i in $(seq "${WORKSET_TRIPLES:-3}"); do
    timeout 120 python "$here/working_set.py" --mode native --repeat 3 --json "$out/workset_native_$i.json"
    allocctl pool trim >/dev/null  # the pool cold: every chunk made anew
    allocctl --json status >"$out/workset_cold_${i}_before.json"
    ALLOCD_READ_AHEAD_MS=0 timeout 120 python "$here/working_set.py" --mode transparent --socket "$sock" --repeat 3 --json "$out/workset_cold_$i.json"
    allocctl --json status >"$out/workset_cold_${i}_pool.json"  # what the cold run made
    # Chunks the process made leave the pool when freed: still cold. The
    # daemon's own chunks stay cached for the warm runs.
    ALLOCD_READ_AHEAD_MS=200 timeout 120 python "$here/working_set.py" --mode transparent --socket "$sock" --repeat 3 --json "$out/workset_cold_read_ahead_$i.json"
    ALLOCD_READ_AHEAD_MS=0 ALLOCD_CLIENT_CREATES=0 timeout 120 python "$here/working_set.py" --mode transparent --socket "$sock" --repeat 3 --json "$out/workset_cold_daemon_creates_$i.json"
    ALLOCD_READ_AHEAD_MS=0 timeout 120 python "$here/working_set.py" --mode transparent --socket "$sock" --repeat 3 --json "$out/workset_warm_$i.json"
    ALLOCD_READ_AHEAD_MS=200 timeout 120 python "$here/working_set.py" --mode transparent --socket "$sock" --repeat 3 --json "$out/workset_warm_read_ahead_$i.json"
    # The defaults: the last run's working set mapped from the cache while
    # the process starts.
    ALLOCD_HANDOVER_MS=30000 timeout 120 python "$here/working_set.py" --mode transparent --socket "$sock" --repeat 3 --json "$out/workset_warm_handover_$i.json"
    allocctl --json status >"$out/workset_warm_handover_${i}_pool.json"
    allocctl pool trim >/dev/null  # room for the next native run
  done
  unset ALLOCD_HANDOVER_MS
  allocctl status
  stop_daemon
  if [ -z "${SKIP_CHUNK_BENCH:-}" ]; then  # set: the processes' runs only
    step "cuda_chunk_bench: the working set each way in one process, segments of 2 MiB to 2 GiB"
    timeout 240 "$bin/cuda_chunk_bench" --allocd "$bin/allocd" --iterations 400 \
      --working-set-gib 40 --capacity 44GiB --out "$out/cuda_chunk_bench.json" | tail -60
  fi
  pack transparent
fi

if want peaks; then
  start_daemon
  step "two transparent jobs, alternating 44 GiB peaks"
  t0=$(python -c "import time; print(time.time() + 8)")
  jobs=()
  for i in 0 1; do
    timeout 120 python "$here/alternating_peaks.py" --index $i --mode transparent --socket "$sock" \
      --start "$t0" --json "$out/peaks_transparent_$i.json" &
    jobs+=($!)
  done
  wait "${jobs[@]}"  # not the daemon, a child of this shell too
  cat "$out"/peaks_transparent_*.json; echo
  stop_daemon
  pack transparent
fi

if want kills; then
  start_daemon
  step "kill -9 of a transparent job holding 20 GiB"
  python - "$sock" >"$out/holder.out" 2>&1 <<'PY' &
import sys, time, allocd
allocd.enable(socket=sys.argv[1], job="holder", required=True)
import torch
x = torch.ones(20 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(600)
PY
  holder=$!
  for _ in $(seq 600); do grep -q ready "$out/holder.out" && break; sleep 0.1; done
  allocctl --json status >"$out/kill_before.json"; allocctl status
  kill -9 $holder; wait $holder 2>/dev/null; sleep 1
  allocctl --json status >"$out/kill_after.json"; allocctl status
  step "kill -9 of the daemon at step 10 of 30, restarted 1 s later"
  timeout 300 python "$here/llama_lora_train.py" --mode transparent --socket "$sock" \
    --kill-daemon-at 10 --daemon-pid "$daemon" \
    --restart-daemon "'$bin/allocd' serve --backend cuda --socket '$sock' --metrics-addr '' --capacity 76GiB 2>>'$out/daemon2.log'" \
    --json "$out/train_transparent_daemon_killed.json" | cut -c1-200
  pkill -f "allocd serve --backend cuda --socket $sock"
  pack transparent
fi
if want handover; then
  start_daemon
  step "handover: llama_lora natively, then transparent: daemon-made (cached at its end) / handed over / not handed over"
  handover_run() {
    timeout 300 python "$here/llama_lora_train.py" --mode "$2" --socket "$sock" --deterministic \
      $([ "$2" = transparent ] && echo --autotune-mode recommend) --json "$out/handover_$1.json" | cut -c1-200
    allocctl --json status >"$out/handover_$1_pool.json"
  }
  handover_run native native
  ALLOCD_CLIENT_CREATES=0 handover_run first transparent
  handover_run again transparent
  ALLOCD_CLIENT_CREATES=0 handover_run refill transparent
  ALLOCD_HANDOVER_MS=0 handover_run off transparent
  grep -E "registered|ended" "$daemon_log" | tail -8
  stop_daemon
  pack transparent
fi

if want trim; then
  start_daemon 76GiB --trim-after 20s
  # NAME: a 3-step llama_lora job at a fixed shape, and the pool after it;
  # deterministic, so that its losses on a warm and a trimmed pool compare.
  trim_job() {
    timeout 200 python "$here/llama_lora_train.py" --mode transparent --socket "$sock" --steps 3 \
      --shape 4x512 --deterministic --json "$out/trim_$1.json" >/dev/null
    allocctl --json status >"$out/trim_$1_pool.json"
  }
  step "trim: a job on a warm pool, then on a trimmed one, 2 pairs"
  trim_job prime
  for i in 1 2; do
    trim_job warm_$i
    allocctl pool trim
    allocctl --json status >"$out/trim_cold_${i}_before.json"
    trim_job cold_$i
  done
  step "trim: the node idle for 30 s (--trim-after 20s)"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader | tee "$out/trim_idle_smi_before.txt"
  sleep 30
  allocctl --json status >"$out/trim_idle_pool.json"; allocctl status
  nvidia-smi --query-gpu=memory.used --format=csv,noheader | tee "$out/trim_idle_smi_after.txt"
  stop_daemon
  pack transparent
fi
step summary
python "$here/summarize_transparent.py" "$out"
pack transparent
