#!/usr/bin/env bash
# The memory ledger against `loom plan memory`, to the byte, for f32 and bf16 at ZeRO 0-3, at
# dp 4 and at dp 2 x tp 2, for pipeline stages, MoE and context parallel; at dp 4, optimizer state / master weights / gradients / weights
# sharded to a quarter and the communication per step against theory; parallel.invariant's
# trees and the tied head's buffer (DDP, ZeRO 1-3, pp; cp-fold under ZeRO-3); and (stage 3) parameter
# all-gathers overlapping compute in the trace.
#   zero_memory.sh LOOM COMPARE "MPIRUN..."
set -euo pipefail
loom=$1 compare=$2 mpirun=$3
. "$(dirname "$0")/../lib.sh"
test_dir
common=(--set model.n_layer=4 --set model.d_model=64 --set model.n_head=4 --set model.vocab_size=500
        --set model.seq_len=32 --set train.micro_batch=2 --set train.global_batch=8 --set train.steps=2
        --set train.threads=1 --set train.device=cpu --set data.val_batches=0)
# dp4inv: parallel.invariant's point-to-point bytes (dp_comm.send_b) in the communication check.
for layout in "dp4:--set parallel.dp=4" "dp2tp2:--set parallel.dp=2 --set parallel.tp=2 --set parallel.sp=true" \
  "dp4inv:--set parallel.dp=4 --set parallel.invariant=true --set model.arch=llama"; do
  name=${layout%%:*}
  read -r -a lay <<< "${layout#*:}"
  for dtype in f32 bf16; do
    [ "$name" = dp4inv ] && [ "$dtype" = bf16 ] && continue
    for z in 0 1 2 3; do
      run=$dir/${name}_${dtype}_z$z
      "$loom" plan memory "${common[@]}" "${lay[@]}" --set train.dtype=$dtype --set parallel.zero=$z --json > "$run.plan.json"
      run_or_show "$run.log" $mpirun -np 4 "$loom" train "${common[@]}" "${lay[@]}" \
        --set train.dtype=$dtype --set parallel.zero=$z \
        --set log.dir="$run"
      "$compare" --ledger "$run.plan.json" "$run"
    done
    [ "$name" != dp2tp2 ] && "$compare" --memory "$dir/${name}_${dtype}_z0.plan.json" "$dir/${name}_${dtype}_z"{0,1,2,3}
  done
done
# Pipeline stages (rank 0 is stage 0): its blocks, its activation slots (the schedule's peak)
# and the executor's per-micro-batch buffers; ZeRO with the tied embedding sharded on both
# stages, ZeRO-3 with both reshard policies.
for layout in "--set parallel.pp=2 --set parallel.dp=2" "--set parallel.pp=4 --set parallel.pp_schedule=gpipe" \
  "--set parallel.pp=2 --set parallel.tp=2 --set parallel.sp=true --set train.dtype=bf16" \
  "--set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=2 --set model.tie_embeddings=false" \
  "--set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=1" \
  "--set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=3 --set train.dtype=bf16" \
  "--set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=3 --set parallel.zero3_reshard=after_step" \
  "--set parallel.pp=2 --set parallel.dp=2 --set parallel.pp_schedule=zb" \
  "--set parallel.pp=2 --set parallel.dp=2 --set parallel.pp_schedule=interleaved --set parallel.pp_virtual=2" \
  "--set parallel.pp=2 --set parallel.dp=2 --set parallel.pp_schedule=zbv" \
  "--set parallel.pp=2 --set parallel.dp=2 --set parallel.pp_schedule=dualpipev --set train.micro_batch=1 --set parallel.zero=1" \
  "--set model.arch=llama --set model.moe.num_experts=4 --set parallel.dp=4 --set parallel.ep=2" \
  "--set model.arch=llama --set model.moe.num_experts=4 --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=1" \
  "--set model.arch=llama --set model.moe.num_experts=4 --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=2" \
  "--set model.arch=llama --set model.moe.num_experts=4 --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=3 --set train.dtype=bf16" \
  "--set model.arch=llama --set model.moe.num_experts=4 --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=2 --set parallel.grad_reduce_dtype=bf16" \
  "--set model.arch=llama --set model.moe.num_experts=4 --set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2 --set parallel.zero=2" \
  "--set model.arch=llama --set model.moe.num_experts=4 --set model.moe.capacity_factor=1.5 --set parallel.dp=2 --set parallel.tp=2" \
  "--set model.arch=llama --set parallel.cp=2 --set parallel.dp=2 --set parallel.zero=1" \
  "--set parallel.cp=4 --set parallel.cp_attention=allgather --set train.dtype=bf16" \
  "--set parallel.cp=2 --set parallel.pp=2 --set parallel.zero=1 --set train.recompute=full" \
  "--set model.arch=llama --set model.moe.num_experts=4 --set parallel.cp=2 --set parallel.dp=2 --set parallel.ep=2 --set parallel.zero=3" \
  "--set parallel.invariant=true --set parallel.dp=2 --set parallel.tp=2 --set train.micro_batch=1" \
  "--set parallel.invariant=true --set parallel.dp=4 --set parallel.zero=1" \
  "--set parallel.invariant=true --set parallel.dp=4 --set parallel.zero=3 --set train.micro_batch=1" \
  "--set parallel.invariant=true --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=2" \
  "--set parallel.invariant=true --set model.arch=llama --set parallel.cp=2 --set parallel.dp=2 --set parallel.zero=2" \
  "--set parallel.invariant=true --set parallel.cp=2 --set parallel.dp=2 --set parallel.zero=3" \
  "--set parallel.invariant=true --set parallel.pp=2 --set parallel.dp=2 --set parallel.pp_schedule=zbv"; do
  read -r -a lay <<< "$layout"
  case_n=$((${case_n:-0} + 1))
  run=$dir/case_$case_n  # its own folder: a repeated name would mix two runs' metrics
  "$loom" plan memory "${common[@]}" "${lay[@]}" --json > "$run.plan.json"
  run_or_show "$run.log" $mpirun -np 4 "$loom" train "${common[@]}" "${lay[@]}" --set log.dir="$run"
  "$compare" --ledger "$run.plan.json" "$run"
done
# The bf16 copies of gradients in flight when they are reduced in bf16 (ZeRO 1 and 2, and DDP).
for z in 0 1 2; do
  run=$dir/reduce_bf16_z$z
  "$loom" plan memory "${common[@]}" --set parallel.dp=4 --set train.dtype=bf16 --set parallel.grad_reduce_dtype=bf16 \
    --set parallel.zero=$z --json > "$run.plan.json"
  run_or_show "$run.log" $mpirun -np 4 "$loom" train "${common[@]}" --set parallel.dp=4 --set train.dtype=bf16 \
    --set parallel.grad_reduce_dtype=bf16 --set parallel.zero=$z --set log.dir="$run"
  "$compare" --ledger "$run.plan.json" "$run"
done
"$loom" plan memory "${common[@]}" --set parallel.dp=4
# ZeRO-3's reshard policies at pp 2 x dp 2: the same bits; after_step gathers each unit once a
# step, whatever the micro-batches (4, and 1 with a smaller batch), keeping the stage's weights
# whole (its ledger's params grow by them), and after_forward at least once per micro-batch.
for run in "after_forward 8" "after_step 8" "after_step 2"; do
  read -r policy batch <<< "$run"
  run_or_show "$dir/$policy.log" $mpirun -np 4 "$loom" train "${common[@]}" --set train.micro_batch=1 \
    --set train.global_batch=$batch \
    --set train.steps=3 --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=3 \
    --set parallel.zero3_reshard=$policy --set log.dir="$dir/${policy}_$batch" \
    --set export.final="$dir/${policy}_$batch/final.safetensors"
done
"$compare" "$dir/after_step_8" "$dir/after_forward_8" --loss-rtol 0 --norm-rtol 0 --weight-atol 0 --min-steps 3
python3 - "$dir" <<'PY'
import json, sys
def steps(p):
    return [json.loads(l) for l in open(f"{sys.argv[1]}/{p}/metrics.jsonl") if '"loss"' in l]
a, b, one = steps("after_forward_8"), steps("after_step_8"), steps("after_step_2")
for x, y, z in zip(a, b, one):
    ga, gb, g1 = (r["dp_comm"]["all_gather_b"] for r in (x, y, z))
    print(f"step {x['step']}: all-gather bytes: after_forward {ga}, after_step {gb} (4 micro-batches), {g1} (1)")
    assert gb > 0 and gb == g1, "after_step must gather each unit once a step, whatever the micro-batches"
    assert ga >= 4 * gb, "after_forward gathers every unit for each micro-batch's forward"
pa, pb = a[-1]["mem"]["params_b"], b[-1]["mem"]["params_b"]
print(f"params: after_forward {pa} B, after_step {pb} B")
# (the gathers carry the shards' padding: up to a norm block, 1024 elements at d_model 64, per
# unit and rank; a stage holds at most 4 units, over 2 ranks)
assert abs((pb - pa) - b[-1]["dp_comm"]["all_gather_b"]) <= 4 * 2 * 1024 * 4, "after_step keeps the stage's weights whole (what a step gathers)"
PY
# Overlap needs blocks whose gathers take a while: a wider model, two ranks, a few steps.
run_or_show "$dir/trace.log" $mpirun -np 2 "$loom" train --set model.n_layer=6 \
  --set model.d_model=256 --set model.n_head=4 \
  --set model.seq_len=64 --set train.micro_batch=4 --set train.global_batch=8 --set train.steps=3 \
  --set train.threads=1 --set train.device=cpu --set data.val_batches=0 --set parallel.dp=2 --set parallel.zero=3 \
  --set log.trace=true --set log.dir="$dir/trace"
"$compare" --gather-trace "$dir/trace/trace.rank0.json"
