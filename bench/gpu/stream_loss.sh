#!/bin/bash
# Whether a job's allocation stream loses events (issue 42: `allocd run` on
# batched generation lost 45,821 events in its first seconds, and the daemon
# then left its stream on for 127 s): each workload stepped for SECONDS under
# `allocd run` and in transparent mode (allocd.enable()), one after the
# other, against one daemon (--autotune recommend), each printing what its
# stream sent and dropped every 5 s, then each job's decisions.
#
#   bench/gpu/stream_loss.sh [BUNDLE] [OUT] [SECONDS] [WORKLOADS]
#       (default .gpu, /tmp/allocd-stream-loss, 45, generate,churn)
#
# Results: OUT/WORKLOAD-{run,enable}.log (JSON lines; the last is the
# total), OUT/daemon.log.
set -u
bundle=$(cd "${1:-.gpu}" && pwd)
out=${2:-/tmp/allocd-stream-loss}
seconds=${3:-45}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
sock=$out/allocd.sock daemon_log=$out/daemon.log
. "$here/common.sh"
start_daemon device --autotune recommend
status=0
for workload in $(echo "${4:-generate,churn}" | tr , ' '); do
  "$bin/allocd" run --socket "$sock" --job "stream-loss-$workload-run" -- \
      python3 "$here/stream_loss_job.py" --workload "$workload" --seconds "$seconds" \
      > "$out/$workload-run.log" 2>&1 || status=1
  python3 "$here/stream_loss_job.py" --workload "$workload" --seconds "$seconds" \
      --enable "$sock" > "$out/$workload-enable.log" 2>&1 || status=1
  for mode in run enable; do
    echo "$workload, $mode: $(grep '^{' "$out/$workload-$mode.log" | tail -1)"
  done
done
grep -o 'job "stream-loss-[^"]*" decision [0-9]* for tenant [^ ]* ([a-z_]*): [a-z]*' "$daemon_log"
stop_daemon
exit $status
