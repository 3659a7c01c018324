#!/bin/bash
# The autotuning loop on a real GPU (issue 12, deliver 6): one daemon with
# --autotune apply; llama_lora (advisor and transparent managed mode) and a
# multi-scale ResNet-50 (advisor) started under the guides'
# max_split_size_mb:64, each against a native run of the same config; the
# advisor's recording overhead (autotune_overhead.py). Everything lands in
# OUT (one tarball, OUT/autotune.tgz, for machines that return few files).
#   bench/gpu/autotune_validation.sh [BUNDLE] [OUT] [PART...]
# PARTS: llama resnet overhead (default: all).
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
# After each part, so a run cut short still returns what it measured.
pack() { (cd "$out" && tar czf autotune.tgz --exclude autotune.tgz --exclude allocd.sock \
  --exclude '*.fds' .); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python -c "import torch; print('torch', torch.__version__)"
start_daemon 70GiB --autotune apply --autotune-threads 4 --autotune-first-pass-events 150000
conf=max_split_size_mb:64
if want llama; then
  step "llama_lora, $conf: native"
  PYTORCH_CUDA_ALLOC_CONF=$conf timeout 200 python "$here/llama_lora_train.py" --mode native --steps 30 --json "$out/llama_native.json" | cut -c1-150
  step "llama_lora, $conf: advisor"
  PYTORCH_CUDA_ALLOC_CONF=$conf timeout 200 python "$here/llama_lora_train.py" --mode advise --job llama-adv --steps 30 --socket "$sock" --json "$out/llama_advise.json" | cut -c1-150
  step "llama_lora, $conf: transparent managed"
  PYTORCH_CUDA_ALLOC_CONF=$conf timeout 200 python "$here/llama_lora_train.py" --mode transparent --job llama-mgd --steps 30 --socket "$sock" --json "$out/llama_transparent.json" | cut -c1-150
  pack
fi
if want resnet; then
  step "resnet50, $conf: native (snapshot for allocd tune)"
  PYTORCH_CUDA_ALLOC_CONF=$conf timeout 200 python "$here/resnet_train.py" --mode native --snapshot "$out/resnet.pickle" --json "$out/resnet_native.json" | cut -c1-150
  step "resnet50, $conf: advisor"
  PYTORCH_CUDA_ALLOC_CONF=$conf timeout 200 python "$here/resnet_train.py" --mode advise --job resnet-adv --socket "$sock" --json "$out/resnet_advise.json" | cut -c1-150
  pack
fi
allocctl autotune history --limit 50 --json >"$out/autotune_history.json"
allocctl autotune history --limit 50
allocctl config history --limit 50 >"$out/config_history.txt"
pack
stop_daemon
if want overhead; then
  step "advisor recording overhead"
  timeout 300 python "$here/autotune_overhead.py" --allocd "$bin/allocd" --pairs 5 --steps 100 --warmup 20 --json "$out/overhead.json" | tail -5
fi
pack
