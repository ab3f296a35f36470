#!/usr/bin/env bash
# One script for a short GPU lease (a few minutes on one H200). In order, each step with its
# own timeout so that one hang cannot take the lease:
#   1. build (sm_90 only, to save time) with CUDA, and MPI when there is one;
#   2. the CUDA kernel tests against their CPU twins and the device-group tests (NCCL, and
#      MPI staging CUDA buffers at 1 and 2 ranks), with passed / failed / skipped counts;
#   3. a small model, 30 steps past warm-up: CUDA against the CPU in bf16 and in fp32 (losses,
#      step-1 gradient norm, weights), CUDA against itself and under each recompute policy
#      (bitwise);
#   4. a checkpoint resumed on CUDA, bitwise; a kill and a bit-flip drill on CUDA; a small LLaMA
#      and its MoE (Mixtral blocks), CUDA against the CPU in bf16; MoE at ep 2 over the staged
#      path against one CUDA rank; the GPT-2 model at 2 ranks on the one GPU
#      over the MPI-staged path: dp 2, tp 2 with sp, dp 2 with ZeRO-3, pp 2 (1f1b, gpipe, zb), and tp 2 + sp under full
#      recompute and ZeRO-3 under selective, each against the 1-rank CUDA run (bf16 layout
#      tolerances); with two GPUs, pp 2 over real NCCL (1f1b, gpipe, zb), bitwise against the
#      staged pp 2;
#   5. kernel rates, GPT-2 124M (B=16, T=1024) next to PyTorch, a LLaMA-shaped 1.1B model;
#   6. last, being slowest: compute-sanitizer memcheck and racecheck on the kernel tests.
# Results go to $OUT (or ./device_out); summary.txt is written before the sanitizers and again
# after. The GPU machine reaches no package registry: before the lease run
# launch/device_deps.sh where Debian's registry is reachable, and carry `.deps`; its .debs are
# unpacked into .deps/root (never into /), Open MPI relocated there (OPAL_PREFIX).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}
mkdir -p "$out"
start=$(date +%s)
cmake_extra=()
mpirun=()
if compgen -G ".deps/debs/*.deb" > /dev/null; then
  mkdir -p .deps/root
  for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/root; done
  root=$PWD/.deps/root/usr
  cmake_extra=(-DCMAKE_PREFIX_PATH="$root")
  export LD_LIBRARY_PATH="$root/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu/openmpi/lib:$root/lib/x86_64-linux-gnu/openblas-openmp:${LD_LIBRARY_PATH:-}"
  if [ -x "$root/bin/orterun" ]; then  # Open MPI, relocated into .deps/root
    export OPAL_PREFIX=$root PMIX_INSTALL_PREFIX=$root PATH="$root/bin:$PATH"
    cmake_extra+=(-DMPI_CXX_COMPILER="$root/bin/mpicxx.openmpi" -DMPIEXEC_EXECUTABLE="$root/bin/orterun")
    mpirun=("$root/bin/orterun")
  fi
fi
[ ${#mpirun[@]} -eq 0 ] && command -v mpirun > /dev/null && mpirun=(mpirun)
[ ${#mpirun[@]} -gt 0 ] && mpirun+=(--oversubscribe --bind-to none -x OMP_NUM_THREADS=2 -x LD_LIBRARY_PATH)
[ "$(id -u)" -eq 0 ] && [ ${#mpirun[@]} -gt 0 ] && mpirun+=(--allow-run-as-root)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  "${cmake_extra[@]}" > "$out/configure.log" 2>&1 && cmake --build build-gpu -j"$(nproc)" > "$out/build.log" 2>&1
build=$?
loom=build-gpu/loom
compare=build-gpu/tests/loom_compare_runs
# runs NAME ARGS...: a training run into $out/NAME (metrics, final weights, log).
run() {
  local name=$1
  shift
  timeout 180 "$@" --set log.dir="$out/$name" --set export.final="$out/$name/final.safetensors" > "$out/$name.log" 2>&1 ||
    echo "run $name failed: $(grep -m1 "error:" "$out/$name.log" || tail -1 "$out/$name.log")" >> "$out/failures.txt"
}
# verdict A B ARGS...: the last line of loom_compare_runs, or why there is none.
verdict() {
  "$compare" "$out/$1" "$out/$2" "${@:3}" 2>&1 | tail -1
}
tests="not run"
if [ $build -eq 0 ]; then
  timeout 240 ctest --test-dir build-gpu -R "cuda\.|device_groups" --output-on-failure > "$out/cuda_tests.log" 2>&1
  tests="$(grep -E "tests passed" "$out/cuda_tests.log" || echo "see cuda_tests.log");"
  tests+=" skipped: $(grep -c '\*\*\*Skipped' "$out/cuda_tests.log" || true)"
  $loom info > "$out/info.txt" 2>&1
  # head dim 64: the tensor-core attention; warm-up over after 5 of 30 steps
  small=(--set model.n_layer=2 --set model.d_model=128 --set model.n_head=2 --set train.steps=30
         --set train.warmup_steps=5 --set data.val_batches=0 --set train.micro_batch=8 --set train.global_batch=16)
  bf=(--loss-rtol 2e-2 --norm-rtol 2e-2 --weight-atol 5e-2)
  run small_cpu $loom train "${small[@]}" --set train.device=cpu
  run small_cpu_bf16 $loom train "${small[@]}" --set train.device=cpu --set train.dtype=bf16
  run small_cuda $loom train "${small[@]}" --set train.device=cuda
  parity_bf16=$(verdict small_cuda small_cpu_bf16 "${bf[@]}")
  parity_f32=$(verdict small_cuda small_cpu "${bf[@]}")
  # The same CUDA run again: every reduction has a fixed order, so losses and weights repeat to the bit.
  run small_cuda2 $loom train "${small[@]}" --set train.device=cuda
  repeat=$(verdict small_cuda2 small_cuda --loss-rtol 0 --norm-rtol 0 --weight-atol 0)
  # Recompute changes what is stored, never a value: both policies match the plain run to the bit.
  recompute=""
  for policy in selective full; do
    run small_cuda_$policy $loom train "${small[@]}" --set train.device=cuda --set train.recompute=$policy
    recompute+="$policy: $(verdict small_cuda_$policy small_cuda --loss-rtol 0 --norm-rtol 0 --weight-atol 0 | sed 's/.*: //')  "
  done
  # Checkpoints on CUDA: resume after step 15 of 30, bitwise against the run that went on.
  run ckpt_full $loom train "${small[@]}" --set train.device=cuda --set checkpoint.dir="$out/ckpt" \
    --set checkpoint.every=15
  run ckpt_resumed $loom train "${small[@]}" --set train.device=cuda --set checkpoint.dir="$out/ckpt2" \
    --set checkpoint.every=15 --set checkpoint.resume="$out/ckpt/step-00000015"
  ckpt_resume=$("$compare" --resumed "$out/ckpt_full" "$out/ckpt_resumed" 2>&1 | tail -1)
  # Fault drills on CUDA: a kill, restarted by the supervisor, and a bit flip voted out by the
  # SDC check, each ending bitwise equal to the fault-free run (one rank; MPI when present).
  drills=""
  if [ ${#mpirun[@]} -gt 0 ]; then
    for d in kill bitflip; do
      r=$(LOOM=$PWD/$loom NP=1 DEVICE=cuda SEED=11 LAUNCH="${mpirun[*]} -np" timeout 120 \
        examples/drills/drill.sh $d "$out/drill_$d" 2>&1 | tail -1)
      drills+="$r  "
    done
  fi
  # LLaMA (RMSNorm, RoPE, SwiGLU, grouped-query heads 2/1): CUDA against the CPU in bf16.
  llama=(--set model.arch=llama --set model.n_kv_head=1)
  run llama_cpu_bf16 $loom train "${small[@]}" "${llama[@]}" --set train.device=cpu --set train.dtype=bf16
  run llama_cuda $loom train "${small[@]}" "${llama[@]}" --set train.device=cuda
  parity_llama=$(verdict llama_cuda llama_cpu_bf16 "${bf[@]}")
  # MoE (Mixtral blocks: the routing, permutation and combination kernels, per-expert GEMMs).
  moe=(--set model.moe.num_experts=4)
  run moe_cpu_bf16 $loom train "${small[@]}" "${llama[@]}" "${moe[@]}" --set train.device=cpu --set train.dtype=bf16
  run moe_cuda $loom train "${small[@]}" "${llama[@]}" "${moe[@]}" --set train.device=cuda
  parity_llama+="; MoE: $(verdict moe_cuda moe_cpu_bf16 "${bf[@]}")"
  layouts="not run (no mpirun)"
  if [ ${#mpirun[@]} -gt 0 ]; then
    layouts=""
    lay=(--set train.device=cuda --set parallel.comm=mpi --set train.threads=2)
    run staged_dp2 "${mpirun[@]}" -np 2 $loom train "${small[@]}" "${lay[@]}" --set parallel.dp=2 --set train.micro_batch=4
    run staged_tp2 "${mpirun[@]}" -np 2 $loom train "${small[@]}" "${lay[@]}" --set parallel.tp=2 --set parallel.sp=true
    run staged_zero3 "${mpirun[@]}" -np 2 $loom train "${small[@]}" "${lay[@]}" --set parallel.dp=2 \
      --set parallel.zero=3 --set train.micro_batch=4
    # Recompute inside sharded layouts: the recomputed forward reads sp-gathered inputs and
    # ZeRO-3's re-gathered weights.
    run staged_tp2_full "${mpirun[@]}" -np 2 $loom train "${small[@]}" "${lay[@]}" --set parallel.tp=2 \
      --set parallel.sp=true --set train.recompute=full
    run staged_zero3_selective "${mpirun[@]}" -np 2 $loom train "${small[@]}" "${lay[@]}" --set parallel.dp=2 \
      --set parallel.zero=3 --set train.micro_batch=4 --set train.recompute=selective
    # Pipeline: two stages on the one GPU, over the MPI-staged path (1f1b, gpipe and zb, whose
    # split backward must also give 1f1b's bits).
    run staged_pp2 "${mpirun[@]}" -np 2 $loom train "${small[@]}" "${lay[@]}" --set parallel.pp=2
    run staged_pp2_gpipe "${mpirun[@]}" -np 2 $loom train "${small[@]}" "${lay[@]}" --set parallel.pp=2 \
      --set parallel.pp_schedule=gpipe
    run staged_pp2_zb "${mpirun[@]}" -np 2 $loom train "${small[@]}" "${lay[@]}" --set parallel.pp=2 \
      --set parallel.pp_schedule=zb
    layouts+="pp2_zb vs pp2 (bitwise): $(verdict staged_pp2_zb staged_pp2 --loss-rtol 0 --norm-rtol 0 --weight-atol 0)
  "
    # Expert parallel over the staged path: ep 2 (dp 2, micro-batches of 4) against one CUDA
    # rank routing the same micro-batches.
    run moe_cuda_m4 $loom train "${small[@]}" "${llama[@]}" "${moe[@]}" --set train.device=cuda --set train.micro_batch=4
    run staged_ep2 "${mpirun[@]}" -np 2 $loom train "${small[@]}" "${llama[@]}" "${moe[@]}" "${lay[@]}" \
      --set parallel.dp=2 --set parallel.ep=2 --set train.micro_batch=4
    layouts+="moe ep2: $(verdict staged_ep2 moe_cuda_m4 --loss-rtol 1e-2 --norm-rtol 1e-2 --weight-atol 5e-2)
  "
    for l in dp2 tp2 zero3 tp2_full zero3_selective pp2 pp2_gpipe pp2_zb; do layouts+="$l: $(verdict staged_$l small_cuda --loss-rtol 1e-2 --norm-rtol 1e-2 --weight-atol 5e-2)
  "; done
    # With two GPUs, the pipeline over real NCCL (each schedule) against the staged 1f1b run:
    # the grouped sends and receives the CPU checks under parallel.comm = "nccl-emulated".
    if [ "$(nvidia-smi -L 2> /dev/null | wc -l)" -ge 2 ]; then
      nccl=(--set train.device=cuda --set parallel.comm=nccl --set train.threads=2)
      for sch in 1f1b gpipe zb; do
        run nccl_pp2_$sch "${mpirun[@]}" -np 2 $loom train "${small[@]}" "${nccl[@]}" --set parallel.pp=2 \
          --set parallel.pp_schedule=$sch
      done
      # pp alone moves tensors and reduces nothing between ranks: bitwise (zb splits the
      # backward, which gives 1f1b's bits, as above).
      for sch in 1f1b gpipe zb; do layouts+="nccl pp2 $sch vs staged pp2 (bitwise): $(verdict nccl_pp2_$sch staged_pp2 --loss-rtol 0 --norm-rtol 0 --weight-atol 0)
  "; done
    else
      layouts+="nccl pp2: not run (one GPU; NCCL takes one rank per GPU)
  "
    fi
  fi
  timeout 120 $loom bench kernels --config examples/configs/gpt2_124m_gpu.toml > "$out/kernels_gpt2.log" 2>&1
  timeout 120 $loom bench kernels --config examples/configs/llama_1b_gpu.toml > "$out/kernels_llama1b.log" 2>&1
  timeout 180 $loom bench train --config examples/configs/gpt2_124m_gpu.toml > "$out/bench_gpt2.log" 2>&1
  py=/usr/bin/python3  # Debian's, with its python3-torch, as examples/bench_vs_pytorch.sh
  [ -x "$py" ] || py=python3
  timeout 180 "$py" examples/bench_pytorch.py 8 10 cuda > "$out/bench_gpt2_torch.log" 2>&1
  timeout 180 $loom bench train --config examples/configs/llama_1b_gpu.toml > "$out/bench_llama1b.log" 2>&1
fi
summary() {
  {
    echo "loom device check, $(date -u +%FT%TZ), $(( $(date +%s) - start )) s"
    echo "gpu:   $(cat "$out/gpu.txt")"
    echo "build: $([ $build -eq 0 ] && echo ok || echo "FAILED (see build.log)")"
    echo "cuda kernel and device-group tests: $tests"
    grep -E "FAILED|Failure" "$out/cuda_tests.log" 2>/dev/null | head -10
    cat "$out/failures.txt" 2>/dev/null
    echo "compute-sanitizer memcheck: ${memcheck:-not run} racecheck: ${racecheck:-not run} (0 = clean; 9 = errors, see the logs)"
    grep -hE "^=+ +(Invalid|Error|Race|ERROR)" "$out/memcheck.log" "$out/racecheck.log" 2>/dev/null | sort | uniq -c | head -6
    echo "small model, CUDA run's last line: $(tail -1 "$out/small_cuda.log" 2>/dev/null)"
    echo "small model, CUDA vs CPU bf16: ${parity_bf16:-not run}"
    echo "small model, CUDA vs CPU fp32: ${parity_f32:-not run}"
    echo "small model, CUDA twice (bitwise): ${repeat:-not run}"
    echo "small model, CUDA recompute vs none (bitwise): ${recompute:-not run}"
    echo "small llama, CUDA vs CPU bf16: ${parity_llama:-not run}"
    echo "checkpoint resume on CUDA (bitwise): ${ckpt_resume:-not run}"
    echo "fault drills on CUDA (| drill | fault | detect | recover | restarts | lost | goodput | bitwise |): ${drills:-not run}"
    echo "2 ranks on one GPU (MPI-staged) vs 1 rank: ${layouts:-not run}"
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
