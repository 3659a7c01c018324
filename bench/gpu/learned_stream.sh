#!/bin/bash
# A learned run's allocation stream on a GPU: left off while the run stays
# within what its job reached under the learned config, started (with the
# allocator's state, by the C++ tracker attached mid-run) once it outgrows
# that, and then decided on by the daemon; and in transparent mode started
# when a neighbour reclaims the run's cache (the pre-warms need it).
#
#   bench/gpu/learned_stream.sh [BUNDLE] [OUT] [PART...]     (default: grow reclaim handover)
#
# grow     learned_stream_job.py natively at its base batch for its peak
#          reserved; the daemon (autotune recommend, the job's label set to
#          apply) starts with PyTorch's defaults learned for the job at that
#          peak; the job under advise() at its base batch, then at 4x it.
# reclaim  a daemon of 12 GiB with the job's defaults learned at 16 GiB: the
#          job in transparent mode caches 8 GiB and idles; a neighbour takes
#          8 GiB, which the daemon reclaims from the job's cache.
# own-history  a job that records PyTorch's history itself (for a snapshot)
#          from before advise(): its stream is the tracker's from the start;
#          from mid-run: allocd leaves the history to it and moves to the
#          tracker.
# handover two runs of one label under advise() (nothing learned): the
#          daemon decides on the first one's stream, so the second's is off
#          from its start, and starts once the first ends.
# Results: OUT/learned_stream.log (each phase's JSON line, the daemon's
# autotune status and history for the job), OUT/daemon.log.
set -u
bundle=$(cd "${1:-.gpu}" && pwd)
out=${2:-/tmp/allocd-learned-stream}
shift $(( $# < 2 ? $# : 2 ))
parts=${*:-grow reclaim own-history handover}
mkdir -p "$out"
exec > >(tee -a "$out/learned_stream.log") 2>&1
here=$(cd "$(dirname "$0")" && pwd)
sock=$out/allocd.sock daemon_log=$out/daemon.log
. "$here/common.sh"
job=learned-stream job_py=$here/learned_stream_job.py
status=0

# learn PEAK: a state folder whose learned configs give $job PyTorch's
# defaults, at PEAK bytes reserved; its path on stdout.
learn() {
  local state=$out/state-$1
  mkdir -p "$state"
  python3 "$here/learned_configs.py" "$state/learned_configs.json" "$1" "$job"
  echo "$state"
}

if want grow; then
  step "grow: native, base batch"
  peak=$(python "$job_py" --native | tee /dev/stderr |
         python3 -c 'import json, sys; print(json.loads(sys.stdin.readline())["peak_reserved"])')
  [ -n "$peak" ] || { echo "the native run gave no peak"; exit 1; }
  step "grow: the daemon, with PyTorch's defaults learned for $job at $peak bytes"
  start_daemon device --autotune recommend --state-dir "$(learn "$peak")"
  allocctl autotune set --job "$job" --mode apply >/dev/null
  step "grow: advise(), base batch then 4x"
  python "$job_py" --socket "$sock" --job "$job" --grow || status=1
  sleep 3
  step "grow: the daemon's autotune status and history for $job"
  allocctl --json autotune status
  allocctl --json autotune history --job "$job"
  stop_daemon
fi

if want reclaim; then
  step "reclaim: a 12 GiB daemon, PyTorch's defaults learned for $job at 16 GiB"
  start_daemon 12GiB --autotune recommend --state-dir "$(learn $((16 << 30)))"
  allocctl autotune set --job "$job" --mode apply >/dev/null
  python "$job_py" --transparent --socket "$sock" --job "$job" --cache-gib 8 --wait-s 30 &
  learned=$!
  sleep 20  # its start (the tracker's build is cached by then) and its 8 GiB cached
  step "reclaim: a neighbour takes 8 GiB"
  python "$job_py" --transparent --socket "$sock" --job neighbour --hold-gib 8 --hold-s 3 ||
    status=1
  wait "$learned" || status=1
  stop_daemon
fi

if want own-history; then
  step "own-history: a job that records PyTorch's history itself"
  # Nothing decided: the stream stays on the history until the job arms it.
  start_daemon device --autotune off
  python "$job_py" --socket "$sock" --job own-before --own-history before || status=1
  python "$job_py" --socket "$sock" --job own-after --own-history after || status=1
  stop_daemon
fi

if want handover; then
  step "handover: two runs of one label; the second's stream is read once the first ends"
  start_daemon device --autotune recommend
  python "$job_py" --socket "$sock" --job pair --steps 200 &
  first=$!
  sleep 8  # its session (the tracker's build is cached by then) and its first steps
  python "$job_py" --socket "$sock" --job pair --steps 600 || status=1
  wait "$first" || status=1
  allocctl --json autotune history --job pair
  stop_daemon
fi
exit $status
