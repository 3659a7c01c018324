#!/bin/bash
# A learned run's allocation stream on a GPU: left off while the run stays
# within what its job reached under the learned config, started (with the
# allocator's state, by the C++ tracker attached mid-run) once it outgrows
# that, and then decided on by the daemon.
#
#   bench/gpu/learned_stream.sh [BUNDLE] [OUT]
#
# 1. learned_stream_job.py natively at its base batch: its peak reserved.
# 2. The daemon (autotune recommend, the job's label set to apply) starts
#    with PyTorch's defaults learned for the job, at that peak.
# 3. The job under advise() at its base batch, then at 4x it (--grow).
# Results: OUT/learned_stream.log (each phase's JSON line, the daemon's
# autotune status and history for the job), OUT/daemon.log.
set -u
bundle=$(cd "${1:-.gpu}" && pwd)
out=${2:-/tmp/allocd-learned-stream}
mkdir -p "$out"
exec > >(tee -a "$out/learned_stream.log") 2>&1
here=$(cd "$(dirname "$0")" && pwd)
sock=$out/allocd.sock daemon_log=$out/daemon.log parts=""
. "$here/common.sh"
job=learned-stream

step "native, base batch"
peak=$(python "$here/learned_stream_job.py" --native | tee /dev/stderr |
       python3 -c 'import json, sys; print(json.loads(sys.stdin.readline())["peak_reserved"])')
[ -n "$peak" ] || { echo "the native run gave no peak"; exit 1; }

step "the daemon, with PyTorch's defaults learned for $job at $peak bytes"
state=$out/state
mkdir -p "$state"
python3 - "$state/learned_configs.json" "$(id -u)" "$job" "$peak" <<'EOF'
import json, sys
path, uid, job, peak = sys.argv[1:]
json.dump({"format": 1, "jobs": [{
    "tenant": f"uid:{uid}", "job": job, "config": "", "from_config": "max_split_size_mb:64",
    "decision_id": 1, "learned_unix_micros": 0, "predicted_peak_current": 0,
    "predicted_peak_switched": 0, "predicted_peak_allocated": 0,
    "predicted_peak_requested": 0, "realized_peak": int(peak)}]}, open(path, "w"))
EOF
start_daemon device --autotune recommend --state-dir "$state"
allocctl autotune set --job "$job" --mode apply >/dev/null

step "advise(), base batch then 4x"
python "$here/learned_stream_job.py" --socket "$sock" --job "$job" --grow
status=$?
sleep 3
step "the daemon's autotune status and history for $job"
allocctl --json autotune status
allocctl --json autotune history --job "$job"
stop_daemon
exit $status
