#!/bin/bash
# What allocd costs a job's step (issue 42): seq2seq, ResNet-50 channels_last
# and batched generation, each natively (twice: the second native worker's
# ratio is the method's own noise), transparent (allocd.enable()), as
# an unchanged script under `allocd run`, and in advisor mode
# (allocd.advise()), in warm workers (overhead.py) that step one at a time:
# N single steps of each mode, each between two of native's (native, a,
# native, b, ...), every worker's job thread on the first core, its
# autograd threads on the second, all started with one memory layout (no
# address-space randomisation, one hash seed). The daemon serves the GPU
# and decides but pushes nothing (autotune recommend; AUTOTUNE=off: none),
# so that every step runs one config; it runs on the last DAEMON_CORES
# cores (default 4), the workers on the others.
#
#   bench/gpu/overhead.sh [BUNDLE] [OUT] [N]     (N: default 150)
#
# The modes `learned` (advisor mode), `transparent-learned` and `run-learned`
# (`allocd run`) are runs of a job the daemon learned a config for, which leave
# their allocation stream off while they stay within what the job reached
# under it: the daemon starts with a learned config, PyTorch's defaults (the
# config every mode runs), for each workload's label overhead-W-learned,
# whose mode it sets to apply, with a peak no run reaches.
#
# OVERHEAD_ARGS go to overhead.py after these (e.g. "--alternate 0 --rounds
# 8" for rounds of several steps a mode), WORKLOADS and MODES choose what
# runs (one workload at N = 150 takes 3-5 minutes on an H200 host).
# SAME_LAYOUT=0 starts each worker with a layout of its own, for
# OVERHEAD_ARGS="--processes K": K processes a mode, whose ratios pool K
# layouts (modes that load different libraries cannot share one layout).
# METHOD=toggle runs overhead_toggle.py instead, a process a workload that
# turns advisor mode on and off (allocd.advise(), allocd.shutdown()) between
# its phases, so that every phase shares the process's layout; OVERHEAD_ARGS
# then go to it (e.g. "--cycles 40 --steps 10"), N is unused, and each
# workload's phases are in OUT/toggle-WORKLOAD.json.
# Results: OUT/overhead.json (every step), OUT/overhead.log (the tables).
set -u
bundle=$(cd "${1:-.gpu}" && pwd)
out=${2:-/tmp/allocd-overhead}
steps=${3:-150}
mkdir -p "$out"
exec > >(tee -a "$out/overhead.log") 2>&1
here=$(cd "$(dirname "$0")" && pwd)
sock=$out/allocd.sock daemon_log=$out/daemon.log parts=""
. "$here/common.sh"
step device
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
ncpu=$(nproc) daemon_cores=${DAEMON_CORES:-4}
all_cores=$(taskset -pc $$ | awk '{print $NF}')
taskset -pc "$((ncpu - daemon_cores))-$((ncpu - 1))" $$ >/dev/null  # what start_daemon starts inherits it
state=$out/state learned_jobs=(overhead-{seq2seq,resnet50,generate,churn}-learned)
mkdir -p "$state"
python3 "$here/learned_configs.py" "$state/learned_configs.json" $((1 << 40)) "${learned_jobs[@]}"
start_daemon device --autotune "${AUTOTUNE:-recommend}" --state-dir "$state"
for job in "${learned_jobs[@]}"; do
  allocctl autotune set --job "$job" --mode apply >/dev/null
done
taskset -pc "$all_cores" $$ >/dev/null
echo "daemon on cores $((ncpu - daemon_cores))-$((ncpu - 1)) of $ncpu"
if [ "${METHOD:-alternate}" = toggle ]; then
  status=0
  for workload in $(echo "${WORKLOADS:-seq2seq,resnet50,generate}" | tr , ' '); do
    taskset -c "0-$((ncpu - daemon_cores - 1))" python "$here/overhead_toggle.py" \
        --socket "$sock" --workload "$workload" --job-core 0 --autograd-core 1 \
        --json "$out/toggle-$workload.json" ${OVERHEAD_ARGS:-} || status=1
  done
else
  python "$here/overhead.py" --allocd "$bin/allocd" --socket "$sock" --out "$out" \
      --alternate "$steps" --job-core 0 --autograd-core 1 \
      $([ "${SAME_LAYOUT:-1}" = 0 ] || echo --same-layout) \
      --cpus "0-$((ncpu - daemon_cores - 1))" ${OVERHEAD_ARGS:-} \
      ${WORKLOADS:+--workloads "$WORKLOADS"} ${MODES:+--modes "$MODES"}
  status=$?
fi
# The daemon's CPU time over the run (utime + stime, in clock ticks): the
# replays it ran for the workers, beside their steps.
read -r -a stat < "/proc/$daemon/stat" && \
  echo "daemon CPU time: $(( (stat[13] + stat[14]) / $(getconf CLK_TCK) )) s (--autotune ${AUTOTUNE:-recommend})"
stop_daemon
exit $status
