#!/bin/bash
# The autotuning loop on a real GPU (issue 12, deliver 6): one daemon with
# --autotune apply; llama_lora and a multi-scale ResNet-50, each in advisor
# and transparent managed mode, started under the guides'
# max_split_size_mb:64 and under PyTorch's defaults, against native runs of
# the same steps under both and under what `allocd tune` recommends offline;
# the advisor's recording overhead (autotune_overhead.py). Everything lands
# in OUT (one tarball, OUT/autotune.tgz, for machines that return few files).
#   bench/gpu/autotune_validation.sh [BUNDLE] [OUT] [PART...]
# PARTS: llama resnet overhead (default: all). NATIVE=0: no native runs;
# FIRST_PASS_EVENTS: the daemon's --autotune-first-pass-events (default: its own).
# LLAMA_STEPS (24), RESNET_STEPS (60: 24 of its steps take 3 s, over before a decision lands).
set -u
bundle=$(cd "${1:-.gpu}" && pwd)
out=${2:-/tmp/allocd-autotune}
shift $(( $# < 2 ? $# : 2 ))
parts=${*:-llama resnet overhead}
mkdir -p "$out"
exec > >(tee -a "$out/autotune.log") 2>&1
here=$(cd "$(dirname "$0")" && pwd)
sock=$out/allocd.sock daemon_log=$out/daemon.log
. "$here/common.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python -c "import torch; print('torch', torch.__version__)"
start_daemon 70GiB --autotune apply --autotune-threads 4 ${FIRST_PASS_EVENTS:+--autotune-first-pass-events $FIRST_PASS_EVENTS}
# The starting configs: the guides' and PyTorch's defaults ("" below); each
# job also runs natively under both and under what `allocd tune` finds for
# these workloads offline (expandable_segments:True), the same steps without
# a push, to compare the steps after one with.
starts=("max_split_size_mb:64" "")
tuned=expandable_segments:True
name() { echo "${1:-defaults}" | tr ':,' '__'; }
run_job() {  # run_job WORKLOAD SCRIPT_ARGS...: every start config and mode
  local w=$1 script=$2; shift 2
  for conf in "${starts[@]}" "$tuned"; do
    local n; n=$(name "$conf")
    if [ "${NATIVE:-1}" = 1 ]; then
      step "$w, ${conf:-defaults}: native"
      PYTORCH_CUDA_ALLOC_CONF=$conf timeout 200 python "$here/$script" --mode native "$@" \
        --json "$out/${w}_native_$n.json" | cut -c1-150
    fi
    [ "$conf" = "$tuned" ] && continue
    for mode in advise transparent; do
      step "$w, ${conf:-defaults}: $mode"
      PYTORCH_CUDA_ALLOC_CONF=$conf timeout 200 python "$here/$script" --mode $mode \
        --job "$w-$mode-$n" --socket "$sock" "$@" --json "$out/${w}_${mode}_$n.json" | cut -c1-150
    done
    pack autotune
  done
}
want llama && run_job llama llama_lora_train.py --steps "${LLAMA_STEPS:-24}"
want resnet && run_job resnet resnet_train.py --steps "${RESNET_STEPS:-60}"
allocctl autotune history --limit 50 --json >"$out/autotune_history.json"
allocctl autotune history --limit 50
allocctl config history --limit 50 >"$out/config_history.txt"
pack autotune
stop_daemon
if want overhead; then
  step "advisor recording overhead"
  timeout 300 python "$here/autotune_overhead.py" --allocd "$bin/allocd" --pairs 5 --steps 100 --warmup 20 --json "$out/overhead.json" | tail -5
fi
pack autotune
