#!/usr/bin/env bash
# GPT-2's vocabulary (50257, which no tp divides) at tp 2, 4 and 8: loom pads it to a multiple
# of 64 x tp inside, so each run matches the single rank (losses within 1e-4, the step-1
# gradient norm within 1e-5, weights within 1e-4) and exports the real [50257, C] tensor; the
# weights exported at tp 4 load at tp 1 and give the tp-4 run's final validation loss.
# Weights: most of the 50257 rows see no token in 20 steps, and their tiny gradients (from the
# softmax alone) cross zero, where Adam moves them by up to lr either way on a rounding
# difference; a small lr (3e-4) keeps that at 2e-5 (measured), while a misplaced shard is off by
# the weights' own scale (0.02).
#   vocab_tp.sh LOOM COMPARE "MPIRUN..."
set -euo pipefail
loom=$1 compare=$2 mpirun=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--set model.n_layer=2 --set model.d_model=64 --set model.n_head=8 --set model.vocab_size=50257
        --set model.seq_len=32 --set train.micro_batch=2 --set train.global_batch=2 --set train.steps=20
        --set train.warmup_steps=2 --set train.threads=1 --set train.device=cpu --set data.val_batches=2
        --set data.val_every=0 --set train.lr=3e-4)
"$loom" train "${common[@]}" --set log.dir="$dir/tp1" --set export.final="$dir/tp1/final.safetensors" \
  > "$dir/tp1.log" 2>&1 || { cat "$dir/tp1.log"; exit 1; }
for tp in 2 4 8; do
  $mpirun -np $tp "$loom" train "${common[@]}" --set parallel.tp=$tp --set log.dir="$dir/tp$tp" \
    --set export.final="$dir/tp$tp/final.safetensors" > "$dir/tp$tp.log" 2>&1 || { cat "$dir/tp$tp.log"; exit 1; }
  grep -E "padded to" "$dir/tp$tp.log"
  "$compare" "$dir/tp$tp" "$dir/tp1"
  "$compare" --shape "$dir/tp$tp/final.safetensors" transformer.wte.weight 50257 64
done
"$loom" train "${common[@]}" --set train.steps=0 --set init.from="$dir/tp4/final.safetensors" \
  --set log.dir="$dir/from_tp4" > "$dir/from_tp4.log" 2>&1 || { cat "$dir/from_tp4.log"; exit 1; }
"$compare" --val "$dir/from_tp4" "$dir/tp4" 1e-5
