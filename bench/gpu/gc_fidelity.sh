#!/bin/bash
# Issue #15, GC fidelity: is the replay of a garbage_collection_threshold +
# memory-fraction run exact at the driver's addresses?
#
# Records each workload under GC configs and fractions (one fresh process
# each: PyTorch reads PYTORCH_CUDA_ALLOC_CONF once), then replays each
# snapshot under its own config with bench/fidelity_probe: at the simulated
# addresses, at every recorded segment's address, and at the small-pool ones.
# PyTorch's own counters are the JSON line record_workload.py prints. The
# rules are exact when the "recorded, every segment" row equals them with
# "unmatched 0"; the drift is then the address model (SimBackend).
#
#   bench/gpu/gc_fidelity.sh PROBE [OUT]
#
# PROBE: the fidelity_probe binary (build/release/bench/fidelity_probe, or a
# bundle's bin/fidelity_probe). Needs torch 2.11, transformers and peft, and
# one idle GPU. Results: OUT/<workload>_<n>.json (PyTorch's counters),
# OUT/<workload>_<n>.probe (the replays) and OUT/summary.txt.
set -u
probe=$1
out=${2:-/tmp/allocd-gc-fidelity}
mkdir -p "$out"
total=$(python3 -c 'import torch; print(torch.cuda.get_device_properties(0).total_memory)')
runs=(
  "llama_lora|garbage_collection_threshold:0.6,max_split_size_mb:256|0.2"
  "llama_lora|garbage_collection_threshold:0.5|0.06"
  "llama_lora|garbage_collection_threshold:0.8|0.07"
  "gpt2_full|garbage_collection_threshold:0.6|0.5"
  "gpt2_full|garbage_collection_threshold:0.9,max_split_size_mb:512|0.55"
)
: > "$out/summary.txt"
n=0
for run in "${runs[@]}"; do
  IFS='|' read -r workload conf fraction <<< "$run"
  n=$((n + 1))
  dir="$out/${workload}_$n"
  mkdir -p "$dir"
  PYTORCH_CUDA_ALLOC_CONF=$conf python3 traces/record_workload.py "$workload" \
    --memory-fraction "$fraction" --record "$dir" > "$dir.json" || continue
  "$probe" "$dir/$workload.pickle.gz" "$conf" "$fraction" "$total" > "$dir.probe" 2>&1
  {
    echo "== $workload '$conf' fraction $fraction"
    echo "PyTorch: $(cat "$dir.json")"
    cat "$dir.probe"
  } >> "$out/summary.txt"
done
cat "$out/summary.txt"
