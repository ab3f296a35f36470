#!/usr/bin/env bash
# One script for a short GPU lease (a few minutes on one H200): build; run the CUDA kernel
# tests against their CPU twins and the NCCL test (and last, under compute-sanitizer); train a
# small model on CUDA and on the CPU and compare the per-step losses (bf16 tolerance: 2e-2
# relative); repeat the CUDA run, and run it with each recompute policy, and compare those
# bitwise; time the GEMM, GELU epilogue and
# attention kernels (tensor-core next to row-wise); benchmark GPT-2 124M (B=16, T=1024) next
# to PyTorch and a LLaMA-shaped 1.1B model; print a one-screen summary. Results go to $OUT
# (or ./device_out). Every step has a timeout, so one hang cannot take the lease.
# The GPU machine reaches no package registry: before the lease, run launch/device_deps.sh
# where Debian's registry is reachable, and carry `.deps` with the run; its .debs are unpacked
# into .deps/root (never into /) and CMake looks there first. Without MPI on that machine the
# build is single-process (LOOM_MPI=AUTO finds none), which is all one GPU needs.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}
mkdir -p "$out"
start=$(date +%s)
prefix=()
if compgen -G ".deps/debs/*.deb" > /dev/null; then
  mkdir -p .deps/root
  for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/root; done
  root=$PWD/.deps/root/usr
  prefix=(-DCMAKE_PREFIX_PATH="$root")
  export LD_LIBRARY_PATH="$root/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu/openblas-openmp:${LD_LIBRARY_PATH:-}"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON "${prefix[@]}" > "$out/configure.log" 2>&1 &&
  cmake --build build-gpu -j"$(nproc)" > "$out/build.log" 2>&1
build=$?
tests="not run"
if [ $build -eq 0 ]; then
  timeout 180 ctest --test-dir build-gpu -R "cuda\.|nccl" --output-on-failure > "$out/cuda_tests.log" 2>&1
  tests=$(grep -E "tests passed" "$out/cuda_tests.log" || echo "see cuda_tests.log")
  build-gpu/loom info > "$out/info.txt" 2>&1
  small=(--set model.n_layer=2 --set model.d_model=128 --set model.n_head=2 --set train.steps=20
         --set data.val_batches=0 --set train.micro_batch=8)
  timeout 120 build-gpu/loom train "${small[@]}" --set train.device=cpu --set log.dir="$out/small_cpu" \
    --set export.final="$out/small_cpu/final.safetensors" > "$out/small_cpu.log" 2>&1
  timeout 120 build-gpu/loom train "${small[@]}" --set train.device=cuda --set log.dir="$out/small_cuda" \
    --set export.final="$out/small_cuda/final.safetensors" > "$out/small_cuda.log" 2>&1
  parity=$(build-gpu/tests/loom_compare_runs "$out/small_cuda" "$out/small_cpu" --loss-rtol 2e-2 --weight-atol 1e9 2>&1 | tail -1)
  # The same CUDA run again: every reduction has a fixed order, so losses and weights repeat to the bit.
  timeout 120 build-gpu/loom train "${small[@]}" --set train.device=cuda --set log.dir="$out/small_cuda2" \
    --set export.final="$out/small_cuda2/final.safetensors" > "$out/small_cuda2.log" 2>&1
  repeat=$(build-gpu/tests/loom_compare_runs "$out/small_cuda2" "$out/small_cuda" --loss-rtol 0 --weight-atol 0 2>&1 | tail -1)
  # Recompute changes what is stored, never a value: both policies match the plain run to the bit.
  for policy in selective full; do
    timeout 120 build-gpu/loom train "${small[@]}" --set train.device=cuda --set train.recompute=$policy \
      --set log.dir="$out/small_cuda_$policy" --set export.final="$out/small_cuda_$policy/final.safetensors" \
      > "$out/small_cuda_$policy.log" 2>&1
    recompute="${recompute:-}$policy: $(build-gpu/tests/loom_compare_runs "$out/small_cuda_$policy" "$out/small_cuda" \
      --loss-rtol 0 --weight-atol 0 2>&1 | tail -1 | sed 's/.*: //')  "
  done
  timeout 120 build-gpu/loom bench kernels --config examples/configs/gpt2_124m_gpu.toml > "$out/kernels_gpt2.log" 2>&1
  timeout 120 build-gpu/loom bench kernels --config examples/configs/llama_1b_gpu.toml > "$out/kernels_llama1b.log" 2>&1
  timeout 180 build-gpu/loom bench train --config examples/configs/gpt2_124m_gpu.toml > "$out/bench_gpt2.log" 2>&1
  timeout 180 python3 examples/bench_pytorch.py 8 10 cuda > "$out/bench_gpt2_torch.log" 2>&1
  timeout 180 build-gpu/loom bench train --config examples/configs/llama_1b_gpu.toml > "$out/bench_llama1b.log" 2>&1
fi
summary() {
  {
    echo "loom device check, $(date -u +%FT%TZ), $(( $(date +%s) - start )) s"
    echo "gpu:   $(cat "$out/gpu.txt")"
    echo "build: $([ $build -eq 0 ] && echo ok || echo "FAILED (see build.log)")"
    echo "cuda kernel and nccl tests: $tests"
    grep -E "FAILED|Failure" "$out/cuda_tests.log" 2>/dev/null | head -10
    echo "compute-sanitizer memcheck: ${memcheck:-not run} racecheck: ${racecheck:-not run} (0 = clean; 9 = errors, see the logs)"
    grep -hE "^=+ +(Invalid|Error|Race|ERROR)" "$out/memcheck.log" "$out/racecheck.log" 2>/dev/null | sort | uniq -c | head -6
    echo "small model, CUDA run's last line: $(tail -1 "$out/small_cuda.log" 2>/dev/null)"
    echo "small model, CUDA vs CPU losses: ${parity:-not run}"
    echo "small model, CUDA twice (bitwise): ${repeat:-not run}"
    echo "small model, CUDA recompute vs none (bitwise): ${recompute:-not run}"
    grep -hE "gemm bf16 8192|attention|speedup|error" "$out/kernels_gpt2.log" "$out/kernels_llama1b.log" 2>/dev/null
    echo "GPT-2 124M loom:    $(grep -h "bench train" "$out/bench_gpt2.log" 2>/dev/null || tail -1 "$out/bench_gpt2.log" 2>/dev/null)"
    echo "GPT-2 124M PyTorch: $(tail -1 "$out/bench_gpt2_torch.log" 2>/dev/null)"
    echo "LLaMA 1.1B loom:    $(grep -h "bench train" "$out/bench_llama1b.log" 2>/dev/null || tail -1 "$out/bench_llama1b.log" 2>/dev/null)"
  } > "$out/summary.txt"
}
summary  # everything but the sanitizers, in case the lease ends during them
if [ $build -eq 0 ]; then
  # Last, being the slowest: the kernels' memory accesses (memcheck) and shared-memory hazards
  # (racecheck: the attention kernels' warp and block barriers), on the tests' small shapes.
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [ -x "$san" ]; then
    timeout 150 "$san" --tool memcheck --error-exitcode 9 build-gpu/tests/loom_cuda_tests --gtest_brief=1 \
      > "$out/memcheck.log" 2>&1
    memcheck=$?
    timeout 150 "$san" --tool racecheck --error-exitcode 9 build-gpu/tests/loom_cuda_tests --gtest_brief=1 \
      --gtest_filter='*Attention*' > "$out/racecheck.log" 2>&1
    racecheck=$?
  fi
fi
summary
cat "$out/summary.txt"
