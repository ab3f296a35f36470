#!/usr/bin/env bash
# parallel.invariant's tree all-reduce over more than 2 ranks overlaps the backward: each unit's
# exchanges start as its backward ends, so in every step some complete (in rank 0's trace)
# before the step's backward is over; so do ZeRO-2/3's tree reduce-scatters (below).
# DDP and ZeRO-1 over MPI (nccl-emulated keeps no trace), dp 4, one
# micro-batch a rank (every backward a step's last). The exchanges are polled from the units'
# hooks, which wait for the one in flight: no timing luck is needed.
#   invariant_overlap.sh LOOM COMPARE "MPIRUN..."
set -euo pipefail
loom=$1 compare=$2 mpirun=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--set train.device=cpu --set model.arch=llama --set model.n_layer=6 --set model.d_model=64
        --set model.n_head=4 --set model.vocab_size=256 --set model.seq_len=32 --set train.micro_batch=2
        --set train.global_batch=8 --set train.steps=3 --set train.threads=1 --set data.val_batches=0
        --set parallel.dp=4 --set parallel.invariant=true --set log.trace=true)
for layout in "ddp_mpi:--set parallel.zero=0" "zero1:--set parallel.zero=1"; do
  name=${layout%%:*}
  read -r -a lay <<< "${layout#*:}"
  $mpirun -np 4 "$loom" train "${common[@]}" "${lay[@]}" --set log.dir="$dir/$name" > "$dir/$name.log" 2>&1 ||
    { cat "$dir/$name.log"; exit 1; }
  grep "layout" "$dir/$name.log"
  "$compare" --tree-trace "$dir/$name/trace.rank0.json"
done
# ZeRO-2/3: each unit's micro-batch tree reduce-scatter goes on from the next unit's hook, not
# to its end inside the hook that starts it: after the last backward op, more than the
# embeddings' own 2 exchanges (dp 4) start.
for stage in 2 3; do
  name=zero$stage
  $mpirun -np 4 "$loom" train "${common[@]}" --set parallel.zero=$stage --set log.dir="$dir/$name" > "$dir/$name.log" 2>&1 ||
    { cat "$dir/$name.log"; exit 1; }
  grep "layout" "$dir/$name.log"
  "$compare" --tree-scatter-trace "$dir/$name/trace.rank0.json" 2
done
