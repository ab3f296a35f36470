#!/usr/bin/env bash
# Data parallel against the single-rank run of the same global batch: per-step losses within
# 1e-4 relative over 20 steps and final weights within 1e-4.
#   ddp_parity.sh LOOM COMPARE "LAUNCHER" ARCH DP MICRO_BATCH [ZERO_STAGE]
# LAUNCHER takes the rank count next: "mpirun ... -np" or "srun --mpi=pmix -n".
set -euo pipefail
loom=$1 compare=$2 launch=$3 arch=$4 dp=$5 micro=$6 zero=${7:-0}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--set model.arch="$arch" --set model.n_layer=2 --set model.d_model=32 --set model.n_head=4
        --set model.vocab_size=96 --set model.seq_len=16 --set train.global_batch=8 --set train.steps=20
        --set train.lr=3e-3 --set train.warmup_steps=2 --set train.threads=1 --set data.val_batches=1
        --set data.val_every=10 --set parallel.bucket_mb=0.01)
[ "$arch" = llama ] && common+=(--set model.n_kv_head=2)
"$loom" train "${common[@]}" --set train.micro_batch=8 --set log.dir="$dir/ref" \
  --set export.final="$dir/ref/final.safetensors" > "$dir/ref.log" 2>&1 || { cat "$dir/ref.log"; exit 1; }
$launch "$dp" "$loom" train "${common[@]}" --set parallel.dp="$dp" --set train.micro_batch="$micro" --set parallel.zero="$zero" \
  --set log.dir="$dir/dp" --set export.final="$dir/dp/final.safetensors" > "$dir/dp.log" 2>&1 || { cat "$dir/dp.log"; exit 1; }
grep -E "layout|batch:" "$dir/dp.log"
"$compare" "$dir/dp" "$dir/ref"
