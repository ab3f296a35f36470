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
. "$(dirname "$0")/../lib.sh"
test_dir
common=(--set model.n_layer=2 --set model.d_model=64 --set model.n_head=8 --set model.vocab_size=50257
        --set model.seq_len=32 --set train.micro_batch=2 --set train.global_batch=2 --set train.steps=20
        --set train.warmup_steps=2 --set train.threads=1 --set train.device=cpu --set data.val_batches=2
        --set data.val_every=0 --set train.lr=3e-4)
run_or_show "$dir/tp1.log" "$loom" train "${common[@]}" --set log.dir="$dir/tp1" \
  --set export.final="$dir/tp1/final.safetensors"
for tp in 2 4 8; do
  run_or_show "$dir/tp$tp.log" $mpirun -np $tp "$loom" train "${common[@]}" --set parallel.tp=$tp \
    --set log.dir="$dir/tp$tp" \
    --set export.final="$dir/tp$tp/final.safetensors"
  grep -E "padded to" "$dir/tp$tp.log"
  "$compare" "$dir/tp$tp" "$dir/tp1"
  "$compare" --shape "$dir/tp$tp/final.safetensors" transformer.wte.weight 50257 64
done
run_or_show "$dir/from_tp4.log" "$loom" train "${common[@]}" --set train.steps=0 \
  --set init.from="$dir/tp4/final.safetensors" \
  --set log.dir="$dir/from_tp4"
"$compare" --val "$dir/from_tp4" "$dir/tp4" 1e-5
