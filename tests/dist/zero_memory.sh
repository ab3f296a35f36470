#!/usr/bin/env bash
# ZeRO at dp=4, stages 0-3: the ledger of each run against `loom plan memory` (within 10%),
# optimizer state / gradients / weights sharded to a quarter, communication per step against
# theory, and (stage 3) parameter all-gathers overlapping compute in the trace.
#   zero_memory.sh LOOM COMPARE "MPIRUN..."
set -euo pipefail
loom=$1 compare=$2 mpirun=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--set model.n_layer=4 --set model.d_model=64 --set model.n_head=4 --set model.vocab_size=512
        --set model.seq_len=32 --set train.micro_batch=2 --set train.global_batch=8 --set train.steps=2
        --set train.threads=1 --set data.val_batches=0 --set parallel.dp=4)
"$loom" plan memory "${common[@]}" --json > "$dir/plan.json"
"$loom" plan memory "${common[@]}"
for z in 0 1 2 3; do
  $mpirun -np 4 "$loom" train "${common[@]}" --set parallel.zero=$z --set log.dir="$dir/z$z" \
    > "$dir/z$z.log" 2>&1 || { cat "$dir/z$z.log"; exit 1; }
done
"$compare" --memory "$dir/plan.json" "$dir/z0" "$dir/z1" "$dir/z2" "$dir/z3"
# Overlap needs blocks whose gathers take a while: a wider model, two ranks, a few steps.
$mpirun -np 2 "$loom" train --set model.n_layer=6 --set model.d_model=256 --set model.n_head=4 \
  --set model.seq_len=64 --set train.micro_batch=4 --set train.global_batch=8 --set train.steps=3 \
  --set train.threads=1 --set data.val_batches=0 --set parallel.dp=2 --set parallel.zero=3 \
  --set log.trace=true --set log.dir="$dir/trace" > "$dir/trace.log" 2>&1 || { cat "$dir/trace.log"; exit 1; }
"$compare" --gather-trace "$dir/trace/trace.rank0.json"
