#!/bin/bash
# Issue 13's spike: PyTorch's own allocator, unmodified, on daemon memory
# through liballocd_interpose.so (LD_PRELOAD). How PyTorch binds the calls
# the interposer serves, then transparent_compat.py natively and under the
# interposer (defaults and expandable segments), with the daemon's view.
#   bench/gpu/transparent_spike.sh [BUNDLE] [OUT]
set -u
bundle=$(cd "${1:-.gpu}" && pwd)
out=${2:-/tmp/allocd-spike}
mkdir -p "$out"
exec > >(tee -a "$out/spike.log") 2>&1
here=$(cd "$(dirname "$0")" && pwd)
for l in libssl.so.3 libcrypto.so.3 libz.so.1; do
  ldconfig -p | grep -q "$l " && rm -f "$bundle/lib/$l"
done
export LD_LIBRARY_PATH=$bundle/lib PYTHONPATH=$bundle/python
bin=$bundle/bin sock=$out/allocd.sock
preload=$bundle/python/allocd/liballocd_interpose.so
step() { echo; echo "=== $(date -u +%T) $*"; }

step "how PyTorch binds cudaMalloc and the driver entry points"
tlib=$(python -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
for l in libc10_cuda.so libtorch_cuda.so; do
  echo "-- $l"; ldd "$tlib/$l" | grep -iE "cudart|libcuda\.so" 
  nm -D --undefined-only "$tlib/$l" | grep -E " (cudaMalloc|cudaFree|cudaMemGetInfo|cudaGetDriverEntryPoint[A-Za-z]*)(@|$)"
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

"$bin/allocd" serve --backend cuda --socket "$sock" --metrics-addr '' --capacity 16GiB 2>"$out/daemon.log" &
daemon=$!
for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done

step "native"
timeout 300 python "$here/transparent_compat.py" --json "$out/native.json"
step "transparent (LD_PRELOAD), defaults"
ALLOCD_SOCKET=$sock ALLOCD_JOB=spike ALLOCD_INTERPOSE_VERBOSE=1 LD_PRELOAD=$preload \
  timeout 300 python "$here/transparent_compat.py" --json "$out/allocd.json" 2>"$out/allocd.stderr"
grep -c "from the daemon" "$out/allocd.stderr"; grep -v "^allocd interpose" "$out/allocd.stderr" | tail -20
"$bin/allocctl" --socket "$sock" status
step "native, expandable segments"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 300 python "$here/transparent_compat.py" \
  --only training_step,memory_stats_family,out_of_memory_error,cuda_graph_capture,empty_cache_and_mem_get_info \
  --json "$out/native_expandable.json"
step "transparent, expandable segments"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ALLOCD_SOCKET=$sock ALLOCD_JOB=spike-exp \
  ALLOCD_INTERPOSE_VERBOSE=1 LD_PRELOAD=$preload timeout 300 python "$here/transparent_compat.py" \
  --only training_step,memory_stats_family,out_of_memory_error,cuda_graph_capture,empty_cache_and_mem_get_info \
  --json "$out/allocd_expandable.json" 2>"$out/allocd_expandable.stderr"
grep -c "from the daemon" "$out/allocd_expandable.stderr"; grep "served by" "$out/allocd_expandable.stderr" | sort | uniq -c
grep -v "^allocd interpose" "$out/allocd_expandable.stderr" | tail -20
"$bin/allocctl" --socket "$sock" status
kill $daemon; wait $daemon
python - "$out" <<'PY'
import json, sys
out = sys.argv[1]
for a, b in (("native", "allocd"), ("native_expandable", "allocd_expandable")):
    n, m = (json.load(open(f"{out}/{x}.json"))["checks"] for x in (a, b))
    print(f"-- {b} vs {a}")
    for k in n:
        same = ""
        if k == "training_step" and n[k]["ok"] and m[k]["ok"]:
            same = "losses identical" if n[k]["value"]["losses"] == m[k]["value"]["losses"] else "LOSSES DIFFER"
            same += f", peak reserved {n[k]['value']['peak_reserved']} vs {m[k]['value']['peak_reserved']}"
        print(f"{k:32s} native={'ok' if n[k]['ok'] else 'FAIL'} allocd={'ok' if m[k]['ok'] else 'FAIL: ' + m[k]['error'][:150]} {same}")
PY
