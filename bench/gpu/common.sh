# Sourced by the GPU scripts (run_validation.sh, transparent_validation.sh,
# autotune_validation.sh) after they set `bundle`, `parts` and `sock`:
# the bundle's libraries and Python package on the paths, except what the
# system has (Python's own SSL and zlib), and the helpers they share.
for l in libssl.so.3 libcrypto.so.3 libz.so.1; do
  ldconfig -p | grep -q "$l " && rm -f "$bundle/lib/$l"
done
export LD_LIBRARY_PATH=$bundle/lib PYTHONPATH=$bundle/python ALLOCD_LIB_DIR=$bundle/python/allocd
bin=$bundle/bin
step() { echo; echo "=== $(date -u +%T) $*"; }
want() { [[ " $parts " == *" $1 "* ]]; }
allocctl() { "$bin/allocctl" --socket "$sock" "$@"; }
