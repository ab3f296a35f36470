#!/usr/bin/env bash
# Before a GPU lease, on this machine: packs the binaries that tools/device_check.sh runs
# (built here with sm_90 code, LOOM_CUDA_ARCHITECTURES holding 90) and the shared libraries
# they load into .devbuild/bundle.tar.xz (ignored by git; name `.devbuild` in the device
# tool's carry list, beside `.deps` for Open MPI). device_check.sh then runs them instead of
# building: the lease's minutes go to checks, not to compiling. Left out: the C library,
# libstdc++ and libgcc (the GPU machine's are newer; its PyTorch needs its own), and the CUDA
# driver, NCCL and cuBLAS (hundreds of MB; device_check.sh finds the GPU machine's).
#   device_bundle.sh [BUILD_DIR]     (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
grep -q "LOOM_CUDA_ARCHITECTURES:STRING=.*90" "$build/CMakeCache.txt" ||
  { echo "device_bundle: $build has no sm_90 code (configure with -DLOOM_CUDA_ARCHITECTURES=\"80;90\")" >&2; exit 2; }
bins=("$build/loom" "$build/tests/loom_cuda_tests" "$build/tests/loom_compare_runs" "$build/tests/loom_dist_nccl")
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "device_bundle: $b is missing: build it first (ninja -C $build)" >&2; exit 2; }
done
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tests" "$stage/lib"
cp "$build/loom" "$stage/"
cp "$build/tests/loom_cuda_tests" "$build/tests/loom_compare_runs" "$build/tests/loom_dist_nccl" "$stage/tests/"
if ldd "${bins[@]}" | grep -q "not found"; then
  echo "device_bundle: a library the binaries load is not found here:" >&2
  ldd "${bins[@]}" | grep "not found" >&2
  exit 2
fi
skip='/(libc|libm|libdl|libpthread|librt|libutil|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libnccl|libcublas(Lt)?)\.so'
ldd "${bins[@]}" | awk '$3 ~ /^\// {print $3}' | sort -u | grep -vE "$skip" | while read -r lib; do
  cp -L "$lib" "$stage/lib/"
done
git rev-parse HEAD > "$stage/commit.txt"
git status --short | grep -v '^??' >> "$stage/commit.txt" || true
mkdir -p .devbuild
tar -cJf .devbuild/bundle.tar.xz -C "$stage" .
echo "device_bundle: $(du -h .devbuild/bundle.tar.xz | cut -f1) in .devbuild/bundle.tar.xz ($(ls "$stage/lib" | wc -l) libraries)"
