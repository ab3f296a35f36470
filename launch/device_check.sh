#!/usr/bin/env bash
# One script for a short GPU lease: build, run the CUDA kernel tests against their CPU twins
# and the NCCL test, and print a one-screen summary. Results go to $OUT (or ./device_out).
# The GPU machine reaches no package registry: carry the Debian packages the build needs as
# .deb files in .debs/ (here: `mkdir -p .debs && cd .debs && apt-get download <names>`, the
# names from setup.sh plus their -dev dependencies) and they are unpacked first.
# Not yet here: the model on CUDA and the GPU benchmarks (they come with the CUDA trainer).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}
mkdir -p "$out"
start=$(date +%s)
if compgen -G ".debs/*.deb" > /dev/null; then
  for f in .debs/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON > "$out/configure.log" 2>&1 &&
  cmake --build build-gpu -j"$(nproc)" > "$out/build.log" 2>&1
build=$?
tests="not run"
if [ $build -eq 0 ]; then
  ctest --test-dir build-gpu -R "cuda\.|nccl" --output-on-failure > "$out/cuda_tests.log" 2>&1
  tests=$(grep -E "tests passed" "$out/cuda_tests.log" || echo "see cuda_tests.log")
  build-gpu/loom info > "$out/info.txt" 2>&1
fi
{
  echo "loom device check, $(date -u +%FT%TZ), $(( $(date +%s) - start )) s"
  echo "gpu:   $(cat "$out/gpu.txt")"
  echo "build: $([ $build -eq 0 ] && echo ok || echo "FAILED (see build.log)")"
  echo "cuda kernel and nccl tests: $tests"
  grep -E "FAILED|Failure" "$out/cuda_tests.log" 2>/dev/null | head -20
} | tee "$out/summary.txt"
