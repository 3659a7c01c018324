#!/bin/bash
# The autotuner on jobs it was not built with (issue 30, deliver 8): one
# daemon with --autotune apply and a state dir (learned configs); each
# workload started under the guides' max_split_size_mb:64 and under PyTorch's
# defaults, natively (staying), in advisor mode, in transparent mode, as an
# unchanged script under `allocd run`, and once more in advisor mode (its
# next run: from the learned config); natively under expandable_segments:True
# from step 0 too (the best config `allocd tune` finds for these jobs).
#   bench/gpu/autotune_workloads.sh [BUNDLE] [OUT] [WORKLOAD...]
# WORKLOADS: seq2seq generate (default: both); STEPS_seq2seq (40),
# STEPS_generate (16).
set -u
bundle=$(cd "${1:-.gpu}" && pwd)
out=${2:-/tmp/allocd-workloads}
shift $(( $# < 2 ? $# : 2 ))
parts=${*:-seq2seq generate}
mkdir -p "$out/state"
exec > >(tee -a "$out/workloads.log") 2>&1
here=$(cd "$(dirname "$0")" && pwd)
sock=$out/allocd.sock daemon_log=$out/daemon.log
. "$here/common.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
start_daemon device --autotune apply --autotune-threads 4 --state-dir "$out/state"
script_of() { case $1 in seq2seq) echo seq2seq_train.py ;; generate) echo generate_job.py ;; esac; }
steps_of() { local v="STEPS_$1"; echo "${!v:-$([ "$1" = seq2seq ] && echo 40 || echo 16)}"; }
name() { echo "${1:-defaults}" | tr ':,' '__'; }
for w in seq2seq generate; do
  want "$w" || continue
  script=$here/$(script_of "$w") steps=$(steps_of "$w")
  for conf in "max_split_size_mb:64" "" "expandable_segments:True"; do
    n=$(name "$conf")
    step "$w, ${conf:-defaults}: native"
    PYTORCH_CUDA_ALLOC_CONF=$conf timeout 300 python "$script" --mode native --steps "$steps" \
      --json "$out/${w}_native_$n.json" | cut -c1-200
    [ "$conf" = expandable_segments:True ] && continue
    for mode in advise transparent; do
      step "$w, ${conf:-defaults}: $mode"
      PYTORCH_CUDA_ALLOC_CONF=$conf timeout 300 python "$script" --mode $mode --steps "$steps" \
        --job "$w-$mode-$n" --socket "$sock" --json "$out/${w}_${mode}_$n.json" | cut -c1-200
    done
    step "$w, ${conf:-defaults}: unchanged script under allocd run"
    PYTORCH_CUDA_ALLOC_CONF=$conf timeout 300 "$bin/allocd" run --socket "$sock" \
      --job "$w-run-$n" -- python "$script" --mode native --steps "$steps" \
      --json "$out/${w}_run_$n.json" | cut -c1-200
    step "$w, ${conf:-defaults}: advise again (the learned config)"
    PYTORCH_CUDA_ALLOC_CONF=$conf timeout 300 python "$script" --mode advise --steps "$steps" \
      --job "$w-advise-$n" --socket "$sock" --json "$out/${w}_learned_$n.json" | cut -c1-200
    allocctl autotune history --limit 200 --json >"$out/autotune_history.json"
    pack workloads
  done
done
allocctl autotune history --limit 200 --json >"$out/autotune_history.json"
allocctl autotune learned --json >"$out/learned.json" 2>&1
allocctl autotune history --limit 40
pack workloads
stop_daemon
pack workloads
