#!/bin/bash
# The client's one control loop (LiveSession) in every mode on a GPU, in a
# few minutes: engine_compat.py; transparent_compat.py under `allocd run`;
# ResNet-50 started on max_split_size_mb:64 in advisor mode, transparent and
# as an unchanged script under `allocd run`, each of which the daemon's
# autotuner (apply) should push a better config to (the configs each step
# ran and allocd.stats() are printed); then three packed jobs, transparent.
#
#   bench/gpu/modes_smoke.sh [BUNDLE] [OUT]     (default .gpu, /tmp/allocd-smoke)
set -u
bundle=$(cd "${1:-.gpu}" && pwd); out=${2:-/tmp/allocd-smoke}; mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd); sock=$out/allocd.sock daemon_log=$out/daemon.log parts=""
. "$here/common.sh"
export PYTHONUNBUFFERED=1
step "engine compat"
timeout 150 python "$here/engine_compat.py" --allocd "$bin/allocd" --json "$out/engine_compat.json" | tail -c 600
start_daemon device --autotune apply
export ALLOCD_SOCKET=$sock
step "transparent compat"
"$bin/allocd" run --socket "$sock" -- timeout 150 python "$here/transparent_compat.py" --json "$out/compat_transparent.json" > "$out/compat_transparent.log" 2>&1
python -c "import json; d=json.load(open('$out/compat_transparent.json')); print({k: v.get('ok') for k, v in d.get('checks', d).items()} if isinstance(d, dict) else d)" 2>&1 | tail -c 900
for mode in advise transparent; do
  step "resnet $mode from mss:64, autotune apply"
  PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64 timeout 120 python "$here/resnet_train.py" --mode $mode --steps 16 --socket "$sock" --job smoke-$mode --json "$out/resnet_$mode.json" > "$out/resnet_$mode.log" 2>&1
  echo "exit $?"; python -c "
import json; r=json.load(open('$out/resnet_$mode.json')); print('configs', sorted(set(r.get('step_config', [])))); print('allocd', r.get('allocd'))" 2>&1 | tail -c 900
done
step "unchanged script under allocd run"
PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64 "$bin/allocd" run --socket "$sock" --job smoke-run -- timeout 120 python "$here/resnet_train.py" --mode native --steps 16 --json "$out/resnet_run.json" > "$out/resnet_run.log" 2>&1
echo "exit $?"; python -c "
import json; r=json.load(open('$out/resnet_run.json')); print('configs', sorted(set(str(c) for c in r.get('step_config', [])))); print('allocd', r.get('allocd'))" 2>&1 | tail -c 900
stop_daemon
grep -E "pushed|decision|error|ERROR" "$daemon_log" | tail -12
step "packing N=3 transparent"
MODES_ALTERNATE="transparent" timeout 100 bash "$here/packing.sh" "$bundle" "$out/pk" alternate 2>&1 | grep -E "^\| alternate \| 3"
