#!/usr/bin/env bash
# train.device = "cuda-emulated": the CUDA backend, its kernels, cuBLASLt calls, streams and
# staging on the CPU emulation, against the CPU's bf16 run and against itself.
#   single: gpt2 and llama (GQA 2:1) and llama MoE (dropless, and with a capacity that drops)
#           against the CPU bf16 run (losses, step-1
#           norm, every tensor's step-1 gradient norm, weights, within bf16's tolerances; the
#           weights' 5e-2 is about what 4 Adam steps can move a weight, so the losses and the
#           per-tensor gradient norms are what catch a wrong result), gpt2 against
#           the CPU fp32 run too; data.doc_mask (gpt2: learned positions, head dim 32; llama
#           at head dim 64: RoPE; both on the flash attention kernels) against the
#           CPU bf16 run with the mask, and unlike the run without it; each
#           recompute policy bitwise against none (MoE's full recompute too); the host
#           synchronizations per step (none from MoE layers, dropless or with a capacity).
#   layouts LAUNCHER: dp 2, dp 2 + ZeRO-3, tp 2 + sp, pp 2 and MoE at ep 2 (dropless, and with a
#           capacity: its padded slots travel whole) over the MPI group's
#           staged path against the single-rank emulated run, then each over nccl-emulated
#           groups, bitwise against the MPI run.
#   cuda_emulated.sh LOOM COMPARE single|layouts ["LAUNCHER -np"]
set -euo pipefail
loom=$1 compare=$2 mode=$3 launch=${4:-}
. "$(dirname "$0")/../lib.sh"
test_dir
# Head dim 32 (the CUDA attention takes 32, 64, 128); 4 steps of 4 x 32 tokens.
gpt2=(--set model.arch=gpt2 --set model.n_layer=2 --set model.d_model=64 --set model.n_head=2)
llama=(--set model.arch=llama --set model.n_layer=2 --set model.d_model=128 --set model.n_head=4
       --set model.n_kv_head=2 --set model.d_ff=256)
common=(--set model.vocab_size=96 --set model.seq_len=32 --set train.global_batch=4 --set train.micro_batch=2
        --set train.steps=4 --set train.lr=3e-3 --set train.warmup_steps=1 --set train.threads=1
        --set train.dtype=bf16 --set data.val_batches=0)
bf16_tol=(--loss-rtol 2e-3 --norm-rtol 5e-3 --weight-atol 5e-2 --min-steps 4)
exact=(--loss-rtol 0 --norm-rtol 0 --weight-atol 0 --min-steps 4)
run() {  # NAME [LAUNCHER NP] ARGS...: one training run into $dir/NAME
  local name=$1
  shift
  local pre=()
  if [ "${1:-}" = "-np" ]; then pre=($launch "$2"); shift 2; fi
  run_or_show "$dir/$name.log" "${pre[@]}" "$loom" train --verbose "${common[@]}" "$@" --set log.dir="$dir/$name" \
    --set export.final="$dir/$name/final.safetensors"
}
syncs() {  # RUN FIELD: the host synchronizations of its last step
  python3 -c 'import json,sys; l=[json.loads(x) for x in open(sys.argv[1]) if "\"host_syncs\"" in x]; print(l[-1]["host_syncs"][sys.argv[2]])' \
    "$dir/$1/metrics.jsonl" "$2"
}

if [ "$mode" = single ]; then
  for arch in gpt2 llama moe moe_cap; do
    case $arch in
      gpt2) model=("${gpt2[@]}") ;;
      llama) model=("${llama[@]}") ;;
      moe) model=("${llama[@]}" --set model.moe.num_experts=4 --set model.moe.top_k=2) ;;
      # A capacity that drops: the padded layout, every shape fixed, the experts' GEMMs batched.
      moe_cap) model=("${llama[@]}" --set model.moe.num_experts=4 --set model.moe.top_k=2
                      --set model.moe.capacity_factor=0.75) ;;
    esac
    run "${arch}_cpu" "${model[@]}" --set train.device=cpu --set log.grad_norms=true
    run "${arch}_emu" "${model[@]}" --set train.device=cuda-emulated --set log.grad_norms=true
    grep -q "peak on the fullest rank (cuda-emulated)" "$dir/${arch}_emu.log" ||
      { echo "FAIL: $arch did not train on the emulated device"; cat "$dir/${arch}_emu.log"; exit 1; }
    echo "$arch: cuda-emulated against the CPU bf16 run"
    "$compare" "$dir/${arch}_emu" "$dir/${arch}_cpu" "${bf16_tol[@]}"
    "$compare" --grad-norms "$dir/${arch}_emu" "$dir/${arch}_cpu" 5e-2
  done
  # Documents packed into 128-token sequences, kept apart (data.doc_mask; token 5 opens one).
  doc=(--set model.seq_len=128 --set data.doc_mask=true --set data.doc_token=5)
  for arch in gpt2 llama; do
    case $arch in
      gpt2) model=("${gpt2[@]}") ;;
      llama) model=("${llama[@]}" --set model.n_head=2 --set model.n_kv_head=1) ;;  # head dim 64
    esac
    run "${arch}_doc_cpu" "${model[@]}" "${doc[@]}" --set train.device=cpu --set log.grad_norms=true
    run "${arch}_doc_emu" "${model[@]}" "${doc[@]}" --set train.device=cuda-emulated --set log.grad_norms=true
    run "${arch}_nodoc_emu" "${model[@]}" "${doc[@]}" --set data.doc_mask=false --set train.device=cuda-emulated \
      --set log.grad_norms=true
    echo "$arch, data.doc_mask: cuda-emulated against the CPU bf16 run"
    "$compare" "$dir/${arch}_doc_emu" "$dir/${arch}_doc_cpu" "${bf16_tol[@]}"
    "$compare" --grad-norms "$dir/${arch}_doc_emu" "$dir/${arch}_doc_cpu" 5e-2
    # The check above catches a device that ignores the mask: without it the attention
    # weights' gradient norms move by far more than its tolerance (0.81 and 0.24 here).
    if "$compare" --grad-norms "$dir/${arch}_doc_emu" "$dir/${arch}_nodoc_emu" 5e-2 > "$dir/${arch}_nodoc.cmp" 2>&1; then
      echo "FAIL: $arch: the unmasked run's gradient norms are within 5e-2 of the masked run's"; exit 1
    fi
    echo "without the mask: $(tail -1 "$dir/${arch}_nodoc.cmp")"
  done
  # And against the CPU's fp32 run (bf16 against fp32: a rounding of 2^-9 per step of every sum).
  run gpt2_cpu_f32 "${gpt2[@]}" --set train.device=cpu --set train.dtype=f32 --set log.grad_norms=true
  echo "gpt2: cuda-emulated against the CPU fp32 run"
  "$compare" "$dir/gpt2_emu" "$dir/gpt2_cpu_f32" --loss-rtol 5e-3 --norm-rtol 2e-2 --weight-atol 5e-2 --min-steps 4
  "$compare" --grad-norms "$dir/gpt2_emu" "$dir/gpt2_cpu_f32" 5e-2
  for policy in selective full; do
    run "gpt2_emu_$policy" "${gpt2[@]}" --set train.device=cuda-emulated --set train.recompute=$policy
    echo "gpt2: recompute $policy bitwise against none"
    "$compare" "$dir/gpt2_emu_$policy" "$dir/gpt2_emu" "${exact[@]}"
    "$compare" --weights-equal "$dir/gpt2_emu_$policy/final.safetensors" "$dir/gpt2_emu/final.safetensors"
  done
  # A MoE layer's recompute plans again on the device, bitwise.
  run moe_emu_full "${llama[@]}" --set model.moe.num_experts=4 --set model.moe.top_k=2 \
    --set train.device=cuda-emulated --set train.recompute=full
  run moe_cap_emu_full "${llama[@]}" --set model.moe.num_experts=4 --set model.moe.top_k=2 \
    --set model.moe.capacity_factor=0.75 --set train.device=cuda-emulated --set train.recompute=full
  for m in moe moe_cap; do
    echo "$m: recompute full bitwise against none"
    "$compare" "$dir/${m}_emu_full" "$dir/${m}_emu" "${exact[@]}"
  done
  # GELU's backward as a kernel of its own instead of the GEMM epilogue: the same model, rounded
  # at another point (the epilogue multiplies the fp32 product, the kernel its bf16 rounding).
  run gpt2_emu_separate "${gpt2[@]}" --set train.device=cuda-emulated --set train.gelu_epilogue=separate
  # The kernel needs the activation's gradient as a buffer of its own; the epilogue does not.
  bwd() { awk '$1 == "(backward)" {print $2}' "$dir/$1.log"; }
  python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)' \
    "$(bwd gpt2_emu_separate)" "$(bwd gpt2_emu)" ||
    die "backward scratch $(bwd gpt2_emu_separate) MiB separate, $(bwd gpt2_emu) fused"
  echo "gpt2: the GELU backward kernel against the epilogue"
  "$compare" "$dir/gpt2_emu_separate" "$dir/gpt2_emu" "${bf16_tol[@]}"
  # Host synchronizations inside the forward and backward of a step: none in a dense step (a
  # staging slot per micro-batch, all free again once the last step's end read the loss), none
  # from MoE layers with a capacity (the plan and every shape stay on the device), none from
  # dropless ones (their experts' GEMMs read the counts on the device), nor in a recompute.
  dense=$(syncs gpt2_emu compute) moe=$(syncs moe_emu compute) moe_cap=$(syncs moe_cap_emu compute)
  moe_full=$(syncs moe_emu_full compute)
  echo "host synchronizations in a step's micro-batches: dense $dense, MoE with a capacity $moe_cap, dropless $moe" \
    "(full recompute: $moe_full) (2 micro-batches)"
  [ "$dense" = 0 ] || die "a dense step's micro-batches synchronized the host $dense times"
  [ "$moe_cap" = 0 ] || die "MoE layers with a capacity synchronized the host $moe_cap times"
  [ "$moe" = 0 ] || die "dropless MoE layers synchronized the host $moe times"
  [ "$moe_full" = 0 ] || die "recomputing dropless MoE layers synchronized the host $moe_full times"
  # The whole dense step: at its end the step clock's 8 phase events, the loss and the gradient
  # norm (README: the CUDA backend on the CPU).
  step=$(syncs gpt2_emu step)
  [ "$step" = 10 ] || die "a dense step synchronized $step times, not the README's 10"
  # What the emulated device refuses.
  if "$loom" train "${common[@]}" "${gpt2[@]}" --set train.device=cuda-emulated --set train.dtype=f32 \
    --set train.steps=1 > "$dir/f32.log" 2>&1; then echo "FAIL: f32 accepted"; exit 1; fi
  grep -q 'the GPU path computes in bf16' "$dir/f32.log" || { cat "$dir/f32.log"; exit 1; }
  if "$loom" train "${common[@]}" "${gpt2[@]}" --set train.device=cuda-emulated --set parallel.comm=nccl \
    --set train.steps=1 > "$dir/nccl.log" 2>&1; then echo "FAIL: nccl accepted"; exit 1; fi
  grep -q 'parallel.comm = "nccl" needs GPUs' "$dir/nccl.log" || { cat "$dir/nccl.log"; exit 1; }
else
  run ref "${llama[@]}" --set train.device=cuda-emulated
  moe=(--set model.moe.num_experts=4 --set model.moe.top_k=2)
  run ref_moe "${llama[@]}" "${moe[@]}" --set train.device=cuda-emulated --set train.micro_batch=1
  cap=(--set model.moe.capacity_factor=0.75)
  run ref_moe_cap "${llama[@]}" "${moe[@]}" "${cap[@]}" --set train.device=cuda-emulated --set train.micro_batch=1
  for layout in dp2 dp2_zero3 tp2_sp pp2 moe_ep2 moe_cap_ep2; do
    ref=ref
    case $layout in
      dp2) args=(--set parallel.dp=2 --set train.micro_batch=1) ;;
      dp2_zero3) args=(--set parallel.dp=2 --set parallel.zero=3 --set train.micro_batch=1) ;;
      tp2_sp) args=(--set parallel.tp=2 --set parallel.sp=true) ;;
      pp2) args=(--set parallel.pp=2 --set train.micro_batch=1) ;;
      moe_ep2) args=("${moe[@]}" --set parallel.dp=2 --set parallel.ep=2 --set train.micro_batch=1) ref=ref_moe ;;
      moe_cap_ep2) args=("${moe[@]}" "${cap[@]}" --set parallel.dp=2 --set parallel.ep=2 --set train.micro_batch=1)
        ref=ref_moe_cap ;;
    esac
    run "$layout" -np 2 "${llama[@]}" --set train.device=cuda-emulated "${args[@]}"
    grep -q "MiB, cuda-emulated" "$dir/$layout.log" || { cat "$dir/$layout.log"; exit 1; }
    echo "$layout: cuda-emulated against its single rank"
    "$compare" "$dir/$layout" "$dir/$ref" "${bf16_tol[@]}"
    # The same layout's groups under NCCL's rules (parallel.comm = "nccl-emulated"): bitwise.
    run "${layout}_nccl" -np 2 "${llama[@]}" --set train.device=cuda-emulated "${args[@]}" \
      --set parallel.comm=nccl-emulated
    grep -q "over NCCL (emulated)" "$dir/${layout}_nccl.log" || { cat "$dir/${layout}_nccl.log"; exit 1; }
    echo "$layout: over nccl-emulated against over MPI"
    "$compare" "$dir/${layout}_nccl" "$dir/$layout" "${exact[@]}"
  done
fi
echo ok
