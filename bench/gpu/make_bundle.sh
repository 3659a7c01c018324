#!/bin/bash
# Builds what the GPU validation runs and gathers it into one folder that can
# be copied to a GPU machine without the build's packages:
#   BUNDLE/bin     allocd, allocctl, cuda_chunks_test, cuda_test_client,
#                  cuda_chunk_bench, vmm_paths_bench
#   BUNDLE/python  the allocd package with liballocd_client.so,
#                  liballocd_torch.so and liballocd_interpose.so
#   BUNDLE/lib     the shared libraries they need beyond the C/C++ runtime
#                  and the NVIDIA driver (gRPC, protobuf, abseil, ...), and
#                  gperftools' libprofiler where this machine has it
#   (and BUNDLE/bin/strace where this machine has it)
#
#   bench/gpu/make_bundle.sh [BUNDLE]     (default .gpu)
#
# Needs the CUDA toolkit at build time (/usr/local/cuda), no GPU. Then, on
# the GPU machine: bench/gpu/run_validation.sh BUNDLE OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle=${1:-.gpu}
build=build/release
cmake --preset release >/dev/null
cmake --build --preset release --target allocd allocctl cuda_chunks_test \
  cuda_test_client cuda_chunk_bench vmm_paths_bench allocd_python_package allocd_client_c allocd_torch \
  allocd_interpose
rm -rf "$bundle/bin" "$bundle/python" "$bundle/lib"
mkdir -p "$bundle/bin" "$bundle/python" "$bundle/lib"
cp "$build/tools/allocd" "$build/tools/allocctl/allocctl" \
   "$build/tests/gpu/cuda_chunks_test" "$build/tests/gpu/cuda_test_client" \
   "$build/bench/gpu/cuda_chunk_bench" "$build/bench/gpu/vmm_paths_bench" \
   "$bundle/bin/"
cp -r "$build/python/allocd" "$build/python/pyproject.toml" "$bundle/python/"
cp "$build/client/interpose/liballocd_interpose.so" "$bundle/python/allocd/"
# What every Linux has, and the driver, which must be the GPU machine's own.
skip='^(linux-vdso|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|ld-linux|libgcc_s\.so|libstdc\+\+\.so|libcuda\.so|libnvidia)'
# gperftools' sampling profiler, where this machine has it (google-perftools):
# overhead.py --cpu-profile-steps profiles the GPU host's workers with it.
profiler=/usr/lib/x86_64-linux-gnu/libprofiler.so.0
[ -e "$profiler" ] && cp -L "$profiler" "$bundle/lib/"
# strace, where this machine has it: overhead.py --syscall-steps counts the
# workers' system calls with it (a GPU host may have none).
strace=$(command -v strace || true)
[ -n "$strace" ] && cp -L "$strace" "$bundle/bin/"
for f in "$bundle"/bin/* "$bundle"/python/allocd/*.so "$bundle"/lib/libprofiler.so.0; do
  [ -e "$f" ] || continue
  ldd "$f" | awk '/=> \//{print $1, $3}' | while read -r name path; do
    [[ $name =~ $skip ]] || cp -Lu "$path" "$bundle/lib/$name"
  done
done
du -sh "$bundle" | awk '{print "bundle: " $1 " in " $2}'
