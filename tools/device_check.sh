#!/usr/bin/env bash
# One script for a short GPU lease (15 minutes in all, 10 a call, 8 files back). Stages, the
# decisive ones first (STAGE names for --only):
#   probe          the GPU, driver, NCCL, compute-sanitizer, /dev/shm, mpirun, a CUDA PyTorch;
#                  later stages adapt (no mpirun: no layouts; a small /dev/shm: Open MPI's
#                  shared memory in /tmp; no sanitizer: none);
#   build          sm_90 only, with CUDA, and MPI when there is one;
#   kernels        the CUDA kernels against their CPU twins and the device groups (NCCL, and
#                  MPI staging CUDA buffers at 1 and 2 ranks), passed / failed / skipped;
#   cpu_reference  the CPU runs the GPU runs are compared with (fp32 and bf16, llama, MoE);
#   parity         a small model 30 steps past warm-up: CUDA against the CPU in bf16 and fp32
#                  (losses, step-1 gradient norm, every tensor's step-1 gradient norm against
#                  bf16, weights), against itself and under each
#                  recompute policy (bitwise); llama and its MoE against the CPU in bf16;
#   ckpt_drills    a checkpoint resumed on CUDA, bitwise; a kill and a bit-flip drill on CUDA;
#   layouts        2 ranks on the one GPU over the MPI-staged path (dp 2, tp 2 + sp, ZeRO-3,
#                  pp 2 with 1f1b, gpipe and zb, tp 2 + sp under full recompute, ZeRO-3 under
#                  selective, MoE at ep 2, cp 2 ring and all-gather) against one CUDA rank; with two GPUs, pp 2 over
#                  real NCCL, bitwise against the staged pp 2;
#   counts         no GPU: `loom bench kernels --counts` (the counting emulation and the time
#                  model's H200/H100 prediction), started in the background once the build is
#                  there, so it costs the lease no time; its figures go into the summary beside
#                  the measured rates of the bench stage (kernel_counts.log in the tarball);
#   bench          kernel rates (MoE's expert GEMMs batched, ragged and one per expert too), GPT-2
#                  124M (B=16, T=1024) and LLaMA-shaped 1.1B, each plain and with its roofline
#                  profile (rates fitted into a cluster file), next to PyTorch eager and
#                  torch.compile on the same shape; attention beside PyTorch's flash and cuDNN
#                  (examples/attention_vs_torch.py);
#   sanitizers     last, being slowest: compute-sanitizer memcheck and racecheck.
# Every stage runs under one global deadline (DEADLINE_S, default 540 s: a 10-minute call
# with room to pack); after each, summary.txt and stages.txt are rewritten and every log is
# packed into logs.tar.gz: the three files in $OUT (default ./device_out), the logs and runs
# themselves in $WORK (default ./device_work). Exits non-zero when a stage failed or ran out
# of time.
#   device_check.sh [--only STAGE,...] [--dry-run]
# --only runs those stages (tools/device_rerun.sh passes the ones that failed); --dry-run
# stubs every stage that needs a GPU (recorded "stubbed"; DRY_STAGE_S makes each take that
# long) and runs the rest, so the deadline, the summary and the packing can be checked on a
# machine without one (SKIP_BUILD=1 BUILD_DIR=build: an existing build instead of building).
# The GPU machine reaches no package registry: before the lease run tools/device_deps.sh
# where Debian's registry is reachable, and carry `.deps`; its .debs are unpacked into
# .deps/root (never into /), Open MPI relocated there (OPAL_PREFIX). With a bundle from
# tools/device_bundle.sh (carry `.devbuild` too) nothing is built there: the build stage
# only checks the binaries are there, and the kernel stage runs the test binaries directly.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}
work=${WORK:-device_work}
mkdir -p "$out" "$work"
out=$(cd "$out" && pwd) work=$(cd "$work" && pwd)
start=$(date +%s)
deadline=$((start + ${DEADLINE_S:-540}))
only="" dry=0
while [ $# -gt 0 ]; do
  case $1 in
    --only) only=",$2," && shift ;;
    --dry-run) dry=1 ;;
    *) echo "usage: device_check.sh [--only STAGE,...] [--dry-run]" >&2 && exit 2 ;;
  esac
  shift
done
: > "$work/stages.txt"
: > "$work/failures.txt"
cmake_extra=()
mpirun=()
orig_ld=${LD_LIBRARY_PATH:-}  # PyTorch's python runs with the machine's own libraries
export PMIX_MCA_pcompress_base_silence_warning=1
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
# A bundle from tools/device_bundle.sh: binaries built here, run instead of building there.
bundled=0
if [ -z "${BUILD_DIR:-}" ] && [ -f .devbuild/bundle.tar.xz ]; then
  rm -rf .devbuild/bin && mkdir -p .devbuild/bin && tar -xJf .devbuild/bundle.tar.xz -C .devbuild/bin
  BUILD_DIR=.devbuild/bin SKIP_BUILD=1 bundled=1
  # NCCL and cuBLAS are the GPU machine's: its CUDA folder, or the NVIDIA wheels beside its PyTorch.
  cuda_libs=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib $(python3 -c "import site; print(' '.join(site.getsitepackages()))" 2> /dev/null | tr ' ' '\n' | sed 's|$|/nvidia|'); do
    [ -d "$d" ] || continue
    for lib in libnccl.so.2 libcublasLt.so.13 libcublas.so.13 libcudart.so.13; do
      for f in "$d/$lib" "$d"/*/lib/"$lib"; do
        [ -e "$f" ] && [[ ":$cuda_libs:" != *":$(dirname "$f"):"* ]] && cuda_libs+=":$(dirname "$f")"
      done
    done
  done
  export LD_LIBRARY_PATH="$PWD/.devbuild/bin/lib${cuda_libs}:${LD_LIBRARY_PATH:-}"
fi
[ ${#mpirun[@]} -eq 0 ] && command -v mpirun > /dev/null && mpirun=(mpirun)
[ ${#mpirun[@]} -gt 0 ] && mpirun+=(--oversubscribe --bind-to none -x OMP_NUM_THREADS=2 -x LD_LIBRARY_PATH)
[ "$(id -u)" -eq 0 ] && [ ${#mpirun[@]} -gt 0 ] && mpirun+=(--allow-run-as-root)
build_dir=${BUILD_DIR:-build-gpu}
loom=$build_dir/loom
compare=$build_dir/tests/loom_compare_runs
py=python3
failed=0

# tmo SECONDS CMD...: timeout, cut to what the deadline leaves (20 s kept for packing).
tmo() {
  local want=$1 left=$((deadline - $(date +%s) - 20))
  shift
  [ "$left" -lt "$want" ] && want=$left
  if [ "$want" -le 0 ]; then
    echo "deadline: not started: $*" >> "$work/failures.txt"
    return 124
  fi
  timeout "$want" "$@"
}
# runs NAME ARGS...: a training run into $work/NAME (metrics, final weights, log).
run() {
  local name=$1
  shift
  tmo 180 "$@" --set log.dir="$work/$name" --set export.final="$work/$name/final.safetensors" > "$work/$name.log" 2>&1 ||
    echo "run $name failed: $(grep -m1 "error:" "$work/$name.log" || tail -1 "$work/$name.log")" >> "$work/failures.txt"
}
# verdict A B ARGS...: the last line of loom_compare_runs, or why there is none.
verdict() {
  "$compare" "$work/$1" "$work/$2" "${@:3}" 2>&1 | tail -1
}
# The small model of the parity stages: head dim 64 (the tensor-core attention), warm-up over
# after 5 of 30 steps.
small=(--set model.n_layer=2 --set model.d_model=128 --set model.n_head=2 --set train.steps=30
       --set train.warmup_steps=5 --set data.val_batches=0 --set train.micro_batch=8 --set train.global_batch=16)
bf=(--loss-rtol 2e-2 --norm-rtol 2e-2 --weight-atol 5e-2)
llama=(--set model.arch=llama --set model.n_kv_head=1)
moe=(--set model.moe.num_experts=4)
cap=(--set model.moe.capacity_factor=0.75)  # padded slots: the plan and every shape on the device
need_build() {
  [ -x "$loom" ] && return 0
  echo "no build: $loom is missing" >> "$work/failures.txt"
  return 1
}

# 0. What the machine has, and what the stages do with it.
stage_probe() {
  {
    echo "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2> /dev/null | head -4 | paste -sd ';' || true)"
    echo "gpus: $(nvidia-smi -L 2> /dev/null | wc -l)"
    echo "nccl: $( (ldconfig -p 2> /dev/null | grep -o 'libnccl.so[.0-9]*'; ls /usr/local/cuda/lib64/libnccl.so* 2> /dev/null) | head -1)"
    local san
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    echo "compute-sanitizer: $([ -x "$san" ] && "$san" --version 2>&1 | tail -1 || echo none)"
    echo "shm: $(df -h /dev/shm 2> /dev/null | awk 'NR == 2 {print $2 " free " $4}')"
    echo "mpirun: ${mpirun[*]:-none}"
  } > "$work/probe.txt"
  # PyTorch with CUDA: the GPU machine's own python3 has it; Debian's (CPU only) is no baseline.
  for p in python3 /usr/bin/python3 /opt/conda/bin/python python; do
    command -v "$p" > /dev/null || continue
    if LD_LIBRARY_PATH=$orig_ld "$p" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2> /dev/null; then
      py=$p
      break
    fi
  done
  echo "bundle: $([ $bundled -eq 1 ] && echo ".devbuild ($(head -1 .devbuild/bin/commit.txt | cut -c1-12)), libraries from ${LD_LIBRARY_PATH%%:/usr*}" || echo "none (builds here)")" >> "$work/probe.txt"
  echo "nccl and cudart linked by loom: $(ldd "$loom" 2> /dev/null | grep -E "nccl|cudart|not found" | awk '{print $1 "=" $3}' | paste -sd ' ')" >> "$work/probe.txt"
  echo "pytorch: $py ($(LD_LIBRARY_PATH=$orig_ld "$py" -c 'import torch; print(torch.__version__, "cuda", torch.cuda.is_available())' 2>&1 | tail -1))" \
    >> "$work/probe.txt"
  # Open MPI's shared memory wants room in /dev/shm; a small one (containers) moves it to /tmp.
  local shm_kb
  shm_kb=$(df -k /dev/shm 2> /dev/null | awk 'NR == 2 {print $4}')
  if [ ${#mpirun[@]} -gt 0 ] && [ "${shm_kb:-0}" -lt 1048576 ]; then
    mpirun+=(--mca btl_vader_backing_directory /tmp)
    echo "shm under 1 GiB: Open MPI's shared memory in /tmp" >> "$work/probe.txt"
  fi
}

# 1. Build for sm_90 only, with CUDA, and MPI when there is one.
stage_build() {
  if [ -n "${SKIP_BUILD:-}" ]; then
    need_build
    return
  fi
  tmo 420 cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    "${cmake_extra[@]}" > "$work/configure.log" 2>&1 &&
    tmo 420 cmake --build "$build_dir" -j"$(nproc)" > "$work/build.log" 2>&1
}

# 2. The CUDA kernels against their CPU twins, and the device groups.
stage_kernels() {
  need_build || return 1
  local rc=0
  if [ -f "$build_dir/CTestTestfile.cmake" ]; then
    tmo 240 ctest --test-dir "$build_dir" -R "cuda\.|device_groups" --output-on-failure > "$work/cuda_tests.log" 2>&1
    rc=$?
    tests="$(grep -E "tests passed" "$work/cuda_tests.log" || echo "see cuda_tests.log");"
    tests+=" skipped: $(grep -c '\*\*\*Skipped' "$work/cuda_tests.log" || true)"
  else  # a bundle: the test binaries themselves (ctest's files name the paths of the build)
    tmo 200 "$build_dir/tests/loom_cuda_tests" --gtest_brief=1 --gtest_color=no > "$work/cuda_tests.log" 2>&1 || rc=1
    tests="kernels: $(grep -E "PASSED|FAILED  \]|SKIPPED" "$work/cuda_tests.log" | grep -v "^\[  FAILED  \] [A-Z]" | paste -sd ' ' || echo "see cuda_tests.log")"
    for np in 1 2; do
      [ ${#mpirun[@]} -gt 0 ] || break
      tmo 90 "${mpirun[@]}" -np $np "$build_dir/tests/loom_dist_nccl" --gtest_brief=1 --gtest_color=no > "$work/device_groups_np$np.log" 2>&1 || rc=1
      tests+="; device groups np $np: $(grep -E "PASSED|FAILED  \]|SKIPPED|skipped" "$work/device_groups_np$np.log" | head -3 | paste -sd ' ')"
    done
  fi
  $loom info > "$work/info.txt" 2>&1
  return $rc
}

# The CPU runs the GPU runs are compared with (no GPU needed: they run in a dry run too).
stage_cpu_reference() {
  need_build || return 1
  run small_cpu $loom train "${small[@]}" --set train.device=cpu --set log.grad_norms=true
  run small_cpu_bf16 $loom train "${small[@]}" --set train.device=cpu --set train.dtype=bf16 --set log.grad_norms=true
  run llama_cpu_bf16 $loom train "${small[@]}" "${llama[@]}" --set train.device=cpu --set train.dtype=bf16
  run moe_cpu_bf16 $loom train "${small[@]}" "${llama[@]}" "${moe[@]}" --set train.device=cpu --set train.dtype=bf16
  run moe_cap_cpu_bf16 $loom train "${small[@]}" "${llama[@]}" "${moe[@]}" "${cap[@]}" --set train.device=cpu \
    --set train.dtype=bf16
}

# 3. The small model: CUDA against the CPU in bf16 and fp32, against itself, under recompute.
stage_parity() {
  need_build || return 1
  run small_cuda $loom train "${small[@]}" --set train.device=cuda --set log.grad_norms=true
  parity_bf16=$(verdict small_cuda small_cpu_bf16 "${bf[@]}")
  # Every tensor's step-1 gradient, not only their global norm: a tensor whose CUDA gradient
  # were zero would pass the weights' tolerance after 30 steps of Adam.
  grads=$("$compare" --grad-norms "$work/small_cuda" "$work/small_cpu_bf16" 5e-2 2>&1 | tail -1)
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
  # LLaMA (RMSNorm, RoPE, SwiGLU, grouped-query heads 2/1) and its MoE (Mixtral blocks: the
  # routing, plan, permutation and combination kernels; dropless with device-sized GEMMs, and
  # with a capacity: padded slots, batched GEMMs): CUDA against CPU bf16.
  run llama_cuda $loom train "${small[@]}" "${llama[@]}" --set train.device=cuda
  parity_llama=$(verdict llama_cuda llama_cpu_bf16 "${bf[@]}")
  run moe_cuda $loom train "${small[@]}" "${llama[@]}" "${moe[@]}" --set train.device=cuda
  parity_llama+="; MoE: $(verdict moe_cuda moe_cpu_bf16 "${bf[@]}")"
  run moe_cap_cuda $loom train "${small[@]}" "${llama[@]}" "${moe[@]}" "${cap[@]}" --set train.device=cuda
  parity_llama+="; MoE with a capacity: $(verdict moe_cap_cuda moe_cap_cpu_bf16 "${bf[@]}")"
  for v in "$parity_bf16" "$grads" "$parity_f32" "$repeat" "$recompute" "$parity_llama"; do
    [[ $v == *FAIL* || $v == *error* || -z $v ]] && return 1
  done
  return 0
}

# 4. A checkpoint resumed on CUDA, bitwise; a kill and a bit-flip drill on CUDA.
stage_ckpt_drills() {
  need_build || return 1
  run ckpt_full $loom train "${small[@]}" --set train.device=cuda --set checkpoint.dir="$work/ckpt" \
    --set checkpoint.every=15
  run ckpt_resumed $loom train "${small[@]}" --set train.device=cuda --set checkpoint.dir="$work/ckpt2" \
    --set checkpoint.every=15 --set checkpoint.resume="$work/ckpt/step-00000015"
  ckpt_resume=$("$compare" --resumed "$work/ckpt_full" "$work/ckpt_resumed" 2>&1 | tail -1)
  # Each drill ends bitwise equal to the fault-free run (one rank; MPI when present).
  drills="not run (no mpirun)"
  if [ ${#mpirun[@]} -gt 0 ]; then
    drills=""
    for d in kill bitflip; do
      r=$(LOOM=$PWD/$loom NP=1 DEVICE=cuda SEED=11 LAUNCH="${mpirun[*]} -np" tmo 120 \
        examples/drills/drill.sh $d "$work/drill_$d" 2>&1 | tail -1)
      drills+="$r  "
      [[ $r == "|"* ]] || echo "drill $d: no result row (see drill_$d/)" >> "$work/failures.txt"
    done
  fi
  [[ $ckpt_resume != *FAIL* && -n $ckpt_resume ]]
}

# 5. Two ranks on the one GPU over the MPI-staged path, against the one CUDA rank; with two
#    GPUs, the pipeline over real NCCL.
stage_layouts() {
  need_build || return 1
  if [ ${#mpirun[@]} -eq 0 ]; then
    layouts="not run (no mpirun)"
    return 0
  fi
  layouts=""
  local lay=(--set train.device=cuda --set parallel.comm=mpi --set train.threads=2)
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
  # Pipeline: two stages on the one GPU (1f1b, gpipe and zb, whose split backward must also
  # give 1f1b's bits).
  run staged_pp2 "${mpirun[@]}" -np 2 $loom train "${small[@]}" "${lay[@]}" --set parallel.pp=2
  run staged_pp2_gpipe "${mpirun[@]}" -np 2 $loom train "${small[@]}" "${lay[@]}" --set parallel.pp=2 \
    --set parallel.pp_schedule=gpipe
  run staged_pp2_zb "${mpirun[@]}" -np 2 $loom train "${small[@]}" "${lay[@]}" --set parallel.pp=2 \
    --set parallel.pp_schedule=zb
  # Bitwise among the schedules: the first GPU run showed 1f1b's reused receive slots written
  # while queued work still read them (the staged copy-back ran outside the streams).
  layouts+="pp2_zb vs pp2 (bitwise): $(verdict staged_pp2_zb staged_pp2 --loss-rtol 0 --norm-rtol 0 --weight-atol 0)
  pp2_gpipe vs pp2 (bitwise): $(verdict staged_pp2_gpipe staged_pp2 --loss-rtol 0 --norm-rtol 0 --weight-atol 0)
  "
  # Expert parallel: ep 2 (dp 2, micro-batches of 4) against one CUDA rank routing the same
  # micro-batches.
  run moe_cuda_m4 $loom train "${small[@]}" "${llama[@]}" "${moe[@]}" --set train.device=cuda --set train.micro_batch=4
  run staged_ep2 "${mpirun[@]}" -np 2 $loom train "${small[@]}" "${llama[@]}" "${moe[@]}" "${lay[@]}" \
    --set parallel.dp=2 --set parallel.ep=2 --set train.micro_batch=4
  layouts+="moe ep2: $(verdict staged_ep2 moe_cuda_m4 --loss-rtol 1e-2 --norm-rtol 1e-2 --weight-atol 5e-2)
  "
  # Context parallel: cp 2 (ring and all-gather; llama's GQA by the ring) against one CUDA rank.
  run staged_cp2 "${mpirun[@]}" -np 2 $loom train "${small[@]}" "${lay[@]}" --set parallel.cp=2
  run staged_cp2_allgather "${mpirun[@]}" -np 2 $loom train "${small[@]}" "${lay[@]}" --set parallel.cp=2 \
    --set parallel.cp_attention=allgather
  run staged_cp2_llama "${mpirun[@]}" -np 2 $loom train "${small[@]}" "${llama[@]}" "${lay[@]}" --set parallel.cp=2
  layouts+="cp2_llama: $(verdict staged_cp2_llama llama_cuda --loss-rtol 1e-2 --norm-rtol 1e-2 --weight-atol 5e-2)
  "
  for l in dp2 tp2 zero3 tp2_full zero3_selective pp2 pp2_gpipe pp2_zb cp2 cp2_allgather; do
    layouts+="$l: $(verdict staged_$l small_cuda --loss-rtol 1e-2 --norm-rtol 1e-2 --weight-atol 5e-2)
  "
  done
  # With two GPUs, the pipeline over real NCCL (each schedule) against the staged 1f1b run:
  # the grouped sends and receives the CPU checks under parallel.comm = "nccl-emulated". pp
  # alone moves tensors and reduces nothing between ranks: bitwise.
  if [ "$(nvidia-smi -L 2> /dev/null | wc -l)" -ge 2 ]; then
    local nccl=(--set train.device=cuda --set parallel.comm=nccl --set train.threads=2)
    for sch in 1f1b gpipe zb; do
      run nccl_pp2_$sch "${mpirun[@]}" -np 2 $loom train "${small[@]}" "${nccl[@]}" --set parallel.pp=2 \
        --set parallel.pp_schedule=$sch
      layouts+="nccl pp2 $sch vs staged pp2 (bitwise): $(verdict nccl_pp2_$sch staged_pp2 --loss-rtol 0 --norm-rtol 0 --weight-atol 0)
  "
    done
  else
    layouts+="nccl pp2: not run (one GPU; NCCL takes one rank per GPU)
  "
  fi
  [[ $layouts != *FAIL* && $layouts != *error* ]]
}

# The prediction from the counts: no GPU, about 20 s of one core. Started in the background
# after the build (counts_start) and collected by the counts stage; --only without counts runs
# none of it.
counts_pid=""
counts_start() {
  [ -n "$only" ] && [[ $only != *",counts,"* ]] && return 0
  [ -x "$loom" ] || return 0
  (
    tmo 200 $loom bench kernels --counts > "$work/kernel_counts.log" 2>&1
    echo $? > "$work/kernel_counts.rc"
  ) &
  counts_pid=$!
}
stage_counts() {
  need_build || return 1
  [ -n "$counts_pid" ] || counts_start
  wait "$counts_pid"
  counts_pid=""
  [ "$(cat "$work/kernel_counts.rc" 2> /dev/null)" = 0 ] && return 0
  echo "counts: loom bench kernels --counts failed: $(grep -m1 "error:" "$work/kernel_counts.log" || tail -1 "$work/kernel_counts.log")" >> "$work/failures.txt"
  return 1
}
# The model's figures: each class's ms per step on the H200 and H100, and the GPT-2 step.
counts_lines() {
  grep -hE "ms per step:|step \(B16 T1024\) on one H200|no ptxas figures|Counted in" "$work/kernel_counts.log" 2> /dev/null |
    sed 's/^/  /'
}

# 6. Kernel rates, GPT-2 124M (B=16, T=1024) next to PyTorch, a LLaMA-shaped 1.1B model.
stage_bench() {
  need_build || return 1
  tmo 120 $loom bench kernels --config examples/configs/gpt2_124m_gpu.toml > "$work/kernels_gpt2.log" 2>&1
  tmo 120 $loom bench kernels --config examples/configs/llama_1b_gpu.toml > "$work/kernels_llama1b.log" 2>&1
  # loom's attention at the reference shapes (in the GPT-2 run's log) beside PyTorch's flash and cuDNN.
  LD_LIBRARY_PATH=$orig_ld tmo 120 "$py" examples/attention_vs_torch.py "$work/kernels_gpt2.log" \
    > "$work/attention_torch.log" 2>&1
  # The experts' GEMMs batched (a capacity), ragged (dropless) and one per expert, Mixtral-shaped.
  tmo 60 $loom bench kernels --config examples/configs/llama_1b_gpu.toml --set model.moe.num_experts=8 \
    --set model.moe.capacity_factor=1.25 > "$work/kernels_moe.log" 2>&1
  tmo 120 $loom bench train --config examples/configs/gpt2_124m_gpu.toml > "$work/bench_gpt2.log" 2>&1
  # The roofline profile of the same run (its tokens/s beside the plain run's: the profiler's
  # overhead), each term predicted by examples/clusters/h200.toml beside the measured one, and
  # the rates refitted into a copy of that file (to bring back as examples/clusters/h200.toml).
  cp examples/clusters/h200.toml "$work/cluster_gpt2.toml"
  cp examples/clusters/h200.toml "$work/cluster_llama1b.toml"
  tmo 120 $loom bench train --config examples/configs/gpt2_124m_gpu.toml --profile \
    --set log.cluster=examples/clusters/h200.toml --write-cluster "$work/cluster_gpt2.toml" \
    > "$work/profile_gpt2.log" 2>&1
  # PyTorch eager, then torch.compile (the anchor), same shape, same process.
  LD_LIBRARY_PATH=$orig_ld tmo 150 "$py" examples/bench_pytorch.py 8 10 cuda --compile > "$work/bench_gpt2_torch.log" 2>&1
  tmo 120 $loom bench train --config examples/configs/llama_1b_gpu.toml > "$work/bench_llama1b.log" 2>&1
  tmo 120 $loom bench train --config examples/configs/llama_1b_gpu.toml --profile \
    --set log.cluster=examples/clusters/h200.toml --write-cluster "$work/cluster_llama1b.toml" \
    > "$work/profile_llama1b.log" 2>&1
  LD_LIBRARY_PATH=$orig_ld tmo 150 "$py" examples/bench_pytorch.py 8 6 cuda --compile --llama1b \
    > "$work/bench_llama1b_torch.log" 2>&1
}

# tokens_per_s of a log's JSON line (loom's bench train, or bench_pytorch.py's run in MODE).
tps() { grep -h "\"tokens_per_s\"" "$1" 2> /dev/null | grep -- "${2:-}" | tail -1 | sed 's/.*"tokens_per_s": \([0-9.e+]*\).*/\1/'; }
# loom's tokens/s against PyTorch's eager and compiled runs, and the profile's table.
bench_lines() {
  local name=$1 loom_log=$2 torch_log=$3 profile_log=$4 l e c p
  l=$(tps "$loom_log") e=$(tps "$torch_log" '"eager"') c=$(tps "$torch_log" '"compile"') p=$(tps "$profile_log")
  echo "$name loom:    $(grep -h "bench train" "$loom_log" 2> /dev/null || tail -1 "$loom_log" 2> /dev/null)"
  echo "$name PyTorch: $(grep -h tokens_per_s "$torch_log" 2> /dev/null | tr '\n' ' ' || true)$(tail -1 "$torch_log" 2> /dev/null | grep -v tokens_per_s)"
  awk -v l="${l:-0}" -v e="${e:-0}" -v c="${c:-0}" -v p="${p:-0}" -v n="$name" 'BEGIN {
    printf "%s loom / PyTorch eager %s, loom / torch.compile %s; profiled run %s of the plain run'"'"'s tokens/s\n", n,
      (l > 0 && e > 0) ? sprintf("%.3f", l / e) : "n/a", (l > 0 && c > 0) ? sprintf("%.3f", l / c) : "n/a",
      (l > 0 && p > 0) ? sprintf("%.3f", p / l) : "n/a" }'
  sed -n '/^roofline profile/,/^roofline:/p' "$profile_log" 2> /dev/null
  grep -hA1 "^predicted on" "$profile_log" 2> /dev/null
}

# 7. Last, being the slowest: the kernels' memory accesses (memcheck) and shared-memory hazards
#    (racecheck: the attention kernels' warp and block barriers), on the tests' small shapes.
stage_sanitizers() {
  need_build || return 1
  local san
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [ ! -x "$san" ]; then
    memcheck="not run (no compute-sanitizer)" racecheck=$memcheck
    return 0
  fi
  tmo 150 "$san" --tool memcheck --error-exitcode 9 "$build_dir/tests/loom_cuda_tests" --gtest_brief=1 \
    > "$work/memcheck.log" 2>&1
  memcheck=$?
  tmo 150 "$san" --tool racecheck --error-exitcode 9 "$build_dir/tests/loom_cuda_tests" --gtest_brief=1 \
    --gtest_filter='*Attention*' > "$work/racecheck.log" 2>&1
  racecheck=$?
  [ "$memcheck" -eq 0 ] && [ "$racecheck" -eq 0 ]
}

summary() {
  {
    echo "loom device check, $(date -u +%FT%TZ), $(( $(date +%s) - start )) s of ${DEADLINE_S:-540}$([ $dry -eq 1 ] && echo ", dry run")"
    echo "stages:"
    sed 's/^/  /' "$work/stages.txt"
    sed 's/^/  /' "$work/probe.txt" 2> /dev/null
    echo "cuda kernel and device-group tests: ${tests:-not run}"
    grep -E "FAILED|Failure" "$work/cuda_tests.log" 2> /dev/null | head -10
    cat "$work/failures.txt" 2> /dev/null
    echo "compute-sanitizer memcheck: ${memcheck:-not run} racecheck: ${racecheck:-not run} (0 = clean; 9 = errors, see the logs)"
    grep -hE "^=+ +(Invalid|Error|Race|ERROR)" "$work/memcheck.log" "$work/racecheck.log" 2> /dev/null | sort | uniq -c | head -6
    echo "small model, CUDA run's last line: $(tail -1 "$work/small_cuda.log" 2> /dev/null)"
    echo "small model, CUDA vs CPU bf16: ${parity_bf16:-not run}"
    echo "small model, CUDA vs CPU bf16, per tensor step-1 gradient norms: ${grads:-not run}"
    echo "small model, CUDA vs CPU fp32: ${parity_f32:-not run}"
    echo "small model, CUDA twice (bitwise): ${repeat:-not run}"
    echo "small model, CUDA recompute vs none (bitwise): ${recompute:-not run}"
    echo "small llama, CUDA vs CPU bf16: ${parity_llama:-not run}"
    echo "checkpoint resume on CUDA (bitwise): ${ckpt_resume:-not run}"
    echo "fault drills on CUDA (| drill | fault | detect | recover | restarts | lost | goodput | bitwise |): ${drills:-not run}"
    echo "2 ranks on one GPU (MPI-staged) vs 1 rank: ${layouts:-not run}"
    echo "predicted from the counts (loom bench kernels --counts, kernel_counts.log; no GPU), then measured:"
    counts_lines
    grep -hE "gemm bf16 8192|attention|speedup|error" "$work/kernels_gpt2.log" "$work/kernels_llama1b.log" 2> /dev/null
    cat "$work/attention_torch.log" 2> /dev/null | tail -8
    grep -hE "moe experts|MoE experts|error" "$work/kernels_moe.log" 2> /dev/null
    bench_lines "GPT-2 124M" "$work/bench_gpt2.log" "$work/bench_gpt2_torch.log" "$work/profile_gpt2.log"
    bench_lines "LLaMA 1.1B" "$work/bench_llama1b.log" "$work/bench_llama1b_torch.log" "$work/profile_llama1b.log"
    cat "$work/cluster_gpt2.toml" 2> /dev/null
  } > "$out/summary.txt"
  cp "$work/stages.txt" "$out/stages.txt"
}
# Every log (not the weights, checkpoints or build) in one tarball: a lease brings back 8 files.
pack() {
  tar -czf "$out/logs.tar.gz.tmp" -C "$work" --exclude='*.safetensors' --exclude='ckpt*' --exclude='*.h5' . 2> /dev/null &&
    mv "$out/logs.tar.gz.tmp" "$out/logs.tar.gz"
}
# stage NAME NEEDS_GPU: runs stage_NAME (unless --only leaves it out, or the deadline has come;
# a dry run stubs the ones that need a GPU), records its status and time, rewrites the summary.
stage() {
  local name=$1 gpu=$2 t0 status before
  [ -n "$only" ] && [[ $only != *",$name,"* ]] && return 0
  t0=$(date +%s)
  if [ "$t0" -ge $((deadline - 20)) ]; then
    status="deadline (not started)"
  elif [ $dry -eq 1 ] && [ "$gpu" -eq 1 ]; then
    [ "${DRY_STAGE_S:-0}" -gt 0 ] && tmo "$DRY_STAGE_S" sleep "$DRY_STAGE_S"
    status=stubbed
    [ "$(date +%s)" -ge $((deadline - 20)) ] && status="stubbed (deadline)"
  else
    before=$(wc -l < "$work/failures.txt")
    "stage_$name"
    local rc=$?
    status=ok
    { [ $rc -ne 0 ] || [ "$(wc -l < "$work/failures.txt")" -ne "$before" ]; } && status=FAILED
    [ "$(date +%s)" -ge $((deadline - 20)) ] && [ $status != ok ] && status="FAILED (deadline)"
  fi
  [[ $status == ok || $status == stubbed ]] || failed=1
  echo "$name: $status, $(( $(date +%s) - t0 )) s" >> "$work/stages.txt"
  summary
  pack
}

# In order, the decisive checks first.
stage probe 0
stage build 0
counts_start
stage kernels 1
stage cpu_reference 0
stage parity 1
stage ckpt_drills 1
stage layouts 1
stage counts 0
stage bench 1
stage sanitizers 1
cat "$out/summary.txt"
exit $failed
