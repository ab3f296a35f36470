#!/usr/bin/env bash
# Runs a command as if on another machine: another CPU name (what a fitted cluster file's
# fitted_on is compared with), another core count (what threads per rank are cut from), and
# OpenBLAS's kernels for another CPU (so every GEMM, every loss, has other low bits). A test that
# passes here and natively depends on none of the three.
#   tests/another_machine.sh ctest --test-dir build -L machine -j2
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARG...]" >&2; exit 2; }
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
# OpenBLAS picks SkylakeX (AVX-512) on Intel and Haswell (AVX2) on AMD: take the other where the
# CPU runs both, else an older kernel than the native one.
if grep -qw avx512f <<< "$flags" && grep -qw avx512bw <<< "$flags"; then
  native=$("${LOOM_BINARY:-$(dirname "$0")/../build/loom}" info 2>/dev/null | grep -o 'USE_OPENMP [A-Za-z0-9]*' | cut -d' ' -f2 || true)
  case "$native" in
    SkylakeX | Cooperlake | SapphireRapids) coretype=Haswell ;;
    *) coretype=SkylakeX ;;
  esac
elif grep -qw avx2 <<< "$flags"; then
  coretype=Sandybridge
else
  coretype=Nehalem
fi
export LOOM_MACHINE_NAME="Another CPU (tests/another_machine.sh), 3 cores"
export LOOM_CORES=3
export OPENBLAS_CORETYPE=$coretype
echo "as another machine: LOOM_MACHINE_NAME='$LOOM_MACHINE_NAME' LOOM_CORES=$LOOM_CORES OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE" >&2
exec "$@"
