#!/bin/bash
# The autotuner on jobs it was not built with (issue 30, deliver 8): one
# daemon with --autotune apply and a state dir (learned configs); each
# workload started under the guides' max_split_size_mb:64 and under PyTorch's
# defaults, natively (staying), in advisor mode, in transparent mode, as an
# unchanged script under `allocd run`, and once more in advisor mode (its
# next run: from the learned config), and the unchanged script once more
# under `allocd run` (LEARNED_RUN=0: not); natively under expandable_segments:True
# from step 0 too (the best config `allocd tune` finds for these jobs).
#   bench/gpu/autotune_workloads.sh [BUNDLE] [OUT] [WORKLOAD...]
# WORKLOADS: seq2seq generate vit_compile llama_lora resnet50 mlm_accum unet moe
# (default: the first five); steps per run: STEPS_seq2seq (30), STEPS_generate
# (14 generate() calls), STEPS_vit_compile (30), STEPS_llama_lora (16),
# STEPS_resnet50 (30), STEPS_mlm_accum (60 optimizer steps of 4 micro-batches),
# STEPS_unet (30), STEPS_moe (30);
# RUN_TIMEOUT (150): seconds each run may take. To run a part only (the rest
# of a call cut short; a daemon started on the last call's STATE dir, copied
# into OUT/state, has its learned configs): CONFS (mss64 defaults
# expandable) and MODES (native advise transparent run learned runlearned). Results are packed into
# OUT/workloads.tgz after every run, so a call cut short still returns what it
# measured. Jobs run one at a time.
set -u
bundle=$(cd "${1:-.gpu}" && pwd)
out=${2:-/tmp/allocd-workloads}
shift $(( $# < 2 ? $# : 2 ))
parts=${*:-seq2seq generate vit_compile llama_lora resnet50}
run_timeout=${RUN_TIMEOUT:-150}
mkdir -p "$out/state"
exec > >(tee -a "$out/workloads.log") 2>&1
here=$(cd "$(dirname "$0")" && pwd)
sock=$out/allocd.sock daemon_log=$out/daemon.log
. "$here/common.sh"
. "$here/workloads.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
start_daemon device --autotune apply --autotune-threads 4 --state-dir "$out/state"
# done_run: the daemon's history so far, and everything packed.
done_run() {
  allocctl autotune history --limit 500 --json >"$out/autotune_history.json"
  pack workloads
}
confs=${CONFS:-mss64 defaults expandable}
modes=" ${MODES:-native advise transparent run learned runlearned} "
[ "${LEARNED_RUN:-1}" = 1 ] || modes=${modes/ runlearned / }
has() { [[ "$modes" == *" $1 "* ]]; }
conf_of() {
  case $1 in mss64) echo max_split_size_mb:64 ;; defaults) echo ;;
    expandable) echo expandable_segments:True ;; esac
}
for w in $parts; do
  want "$w" || continue
  script=$here/$(script_of "$w") steps=$(steps_of "$w")
  for c in $confs; do
    conf=$(conf_of "$c") n=$(name "$(conf_of "$c")")
    if has native; then
      step "$w, ${conf:-defaults}: native"
      PYTORCH_CUDA_ALLOC_CONF=$conf timeout "$run_timeout" python "$script" --mode native \
        --steps "$steps" --json "$out/${w}_native_$n.json" | cut -c1-200
      pack workloads
    fi
    [ "$conf" = expandable_segments:True ] && continue
    for mode in advise transparent; do
      has $mode || continue
      step "$w, ${conf:-defaults}: $mode"
      PYTORCH_CUDA_ALLOC_CONF=$conf timeout "$run_timeout" python "$script" --mode $mode --steps "$steps" \
        --job "$w-$mode-$n" --socket "$sock" --json "$out/${w}_${mode}_$n.json" | cut -c1-200
      done_run
    done
    if has run; then
      step "$w, ${conf:-defaults}: unchanged script under allocd run"
      PYTORCH_CUDA_ALLOC_CONF=$conf timeout "$run_timeout" "$bin/allocd" run --socket "$sock" \
        --job "$w-run-$n" -- python "$script" --mode native --steps "$steps" \
        --json "$out/${w}_run_$n.json" | cut -c1-200
      done_run
    fi
    if has learned; then
      step "$w, ${conf:-defaults}: advise again (the learned config)"
      PYTORCH_CUDA_ALLOC_CONF=$conf timeout "$run_timeout" python "$script" --mode advise \
        --steps "$steps" --job "$w-advise-$n" --socket "$sock" \
        --json "$out/${w}_learned_$n.json" | cut -c1-200
      allocctl autotune learned --json >"$out/learned.json" 2>&1
      done_run
    fi
    has runlearned || continue
    step "$w, ${conf:-defaults}: allocd run again (the learned config, set before the start)"
    PYTORCH_CUDA_ALLOC_CONF=$conf timeout "$run_timeout" "$bin/allocd" run --socket "$sock" \
      --job "$w-run-$n" -- python "$script" --mode native --steps "$steps" \
      --json "$out/${w}_runlearned_$n.json" | cut -c1-200
    done_run
  done
done
allocctl autotune history --limit 500 --json >"$out/autotune_history.json"
allocctl autotune learned --json >"$out/learned.json" 2>&1
allocctl autotune history --limit 40
pack workloads
stop_daemon
pack workloads
