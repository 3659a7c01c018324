#!/bin/bash
# The whole job from its first allocation (issue 40, deliver 5): one daemon
# with --autotune apply and the default --autotune-prior learned (a fresh
# state dir: no learned config; the seed prior, expandable_segments:True,
# until 3 learned configs agree), and every workload
# started from max_split_size_mb:64 and then from PyTorch's defaults in
# advisor, transparent and unchanged-script (`allocd run`) modes, then each of
# those six runs once more (its next run: what it learned). LANES workloads
# run side by side on the one GPU (each its own process and label, as jobs on
# a node do), so what the first runs settle on becomes the node's prior for
# the later ones.
#   [LANES=4] [NATIVES="w..."] bench/gpu/whole_job.sh [BUNDLE] [OUT] [WORKLOAD...]
# WORKLOADS: those of autotune_workloads.sh (seq2seq generate vit_compile
# llama_lora resnet50 mlm_accum unet moe), with its steps (STEPS_<w>).
# STARTS: the start configs each lane runs, in order (mss64 defaults; "defaults
# mss64" has a fresh node's first jobs start from PyTorch's defaults).
# NATIVES: workloads to run natively first under max_split_size_mb:64,
# defaults and expandable_segments:True (staying and the best from step 0),
# where no native run on this GPU is kept. Results, the daemon's history and
# learned configs are packed into OUT/whole_job.tgz after every run; the
# table: bench/gpu/summarize_workloads.py OUT [NATIVES_DIR...].
set -u
bundle=$(cd "${1:-.gpu}" && pwd)
out=${2:-/tmp/allocd-whole-job}
shift $(( $# < 2 ? $# : 2 ))
parts=${*:-seq2seq generate vit_compile llama_lora}
starts=${STARTS:-mss64 defaults}  # in this order in every lane
run_timeout=${RUN_TIMEOUT:-150}
mkdir -p "$out/state"
exec > >(tee -a "$out/whole_job.log") 2>&1
here=$(cd "$(dirname "$0")" && pwd)
sock=$out/allocd.sock daemon_log=$out/daemon.log
. "$here/common.sh"
. "$here/workloads.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
start_daemon device --autotune apply --autotune-threads 4 --state-dir "$out/state"
snapshot() {
  allocctl autotune history --limit 1000 --json >"$out/autotune_history.json.tmp" &&
    mv "$out/autotune_history.json.tmp" "$out/autotune_history.json"
  allocctl autotune learned --json >"$out/learned.json" 2>&1
  pack whole_job
}
# one W CONF MODE: a run of W started on CONF in MODE (native advise
# transparent run; learned / tlearned / runlearned: advise / transparent / run
# again under the same label), its result in OUT/W_MODE_NAME.json.
one() {
  local w=$1 conf=$2 mode=$3 n script steps label json
  n=$(name "$conf") script=$here/$(script_of "$w") steps=$(steps_of "$w")
  local job_mode=$mode
  case $mode in learned) job_mode=advise ;; tlearned) job_mode=transparent ;;
    runlearned) job_mode=run ;; esac
  label="$w-$job_mode-$n" json=$out/${w}_${mode}_$n.json
  step "$w, ${conf:-defaults}: $mode"
  case $job_mode in
    native) PYTORCH_CUDA_ALLOC_CONF=$conf timeout "$run_timeout" python "$script" --mode native \
              --steps "$steps" --json "$json" ;;
    run) PYTORCH_CUDA_ALLOC_CONF=$conf timeout "$run_timeout" "$bin/allocd" run --socket "$sock" \
           --job "$label" -- python "$script" --mode native --steps "$steps" --json "$json" ;;
    *) PYTORCH_CUDA_ALLOC_CONF=$conf timeout "$run_timeout" python "$script" --mode "$job_mode" \
         --steps "$steps" --job "$label" --socket "$sock" --json "$json" ;;
  esac >"$out/${w}_${mode}_$n.log" 2>&1
  echo "$w ${conf:-defaults} $mode: rc $? $(tail -c 300 "$out/${w}_${mode}_$n.log" | tr '\n' ' ' | cut -c1-160)"
  snapshot
}
conf_of() { case $1 in mss64) echo max_split_size_mb:64 ;; expandable) echo expandable_segments:True ;; esac; }
lane() {  # W: its natives (when asked), its first runs, its second runs
  local w=$1 s m
  if [[ " ${NATIVES:-} " == *" $w "* ]]; then
    for s in mss64 defaults expandable; do one "$w" "$(conf_of $s)" native; done
  fi
  for s in $starts; do for m in advise transparent run; do one "$w" "$(conf_of $s)" $m; done; done
  for s in $starts; do for m in learned tlearned runlearned; do one "$w" "$(conf_of $s)" $m; done; done
}
running=()
for w in $parts; do
  lane "$w" &
  running+=($!)
  while [ "$(jobs -rp | wc -l)" -ge "${LANES:-4}" ]; do sleep 1; done
done
wait "${running[@]}"
snapshot
allocctl autotune history --limit 60
stop_daemon
pack whole_job
