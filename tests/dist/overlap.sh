#!/usr/bin/env bash
# A dp=2 run's trace must show gradient all-reduces starting before their step's backward
# ends, and comm_exposed_ms (summed) must be below the all-reduce time it overlapped.
#   overlap.sh LOOM COMPARE "MPIRUN..."
set -euo pipefail
loom=$1 compare=$2 mpirun=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
$mpirun -np 2 "$loom" train --set model.n_layer=4 --set model.d_model=64 --set model.seq_len=64 \
  --set train.micro_batch=4 --set train.global_batch=8 --set train.steps=6 --set train.threads=1 \
  --set data.val_batches=0 --set parallel.dp=2 --set parallel.bucket_mb=0.1 --set log.trace=true \
  --set log.dir="$dir" > "$dir/log" 2>&1 || { cat "$dir/log"; exit 1; }
"$compare" --trace "$dir/trace.rank0.json" "$dir/metrics.jsonl"
