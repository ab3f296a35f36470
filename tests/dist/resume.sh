#!/usr/bin/env bash
# Resume is bitwise: a 20-step run that checkpoints after step 10 (and goes on) against a
# second run resumed from that checkpoint: every step 11-20 has the same loss and gradient
# norm to the bit, and the final weights are the same bits. In the layout given.
#   resume.sh LOOM COMPARE "LAUNCHER" NP DTYPE [--set key=value ...]
set -euo pipefail
loom=$1 compare=$2 launch=$3 np=$4 dtype=$5
shift 5
. "$(dirname "$0")/../lib.sh"
test_dir
common=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=4 --set model.vocab_size=96
        --set model.seq_len=16 --set train.global_batch=8 --set train.micro_batch=2 --set train.steps=20
        --set train.warmup_steps=2 --set train.threads=1 --set train.device=cpu --set train.dtype="$dtype"
        --set data.val_batches=1 --set data.val_every=5 --set checkpoint.dir="$dir/ckpt" --set checkpoint.every=10)
run() {  # NAME ARGS...
  local name=$1
  shift
  run_or_show "$dir/$name.log" ranks "$np" "$loom" train "${common[@]}" "$@" --set log.dir="$dir/$name" \
    --set export.final="$dir/$name/final.safetensors"
}
run full "$@"
grep -E "layout|committed" "$dir/full.log"
# EXPECT_LOG: a line both runs must print (the device they trained on, say).
if [ -n "${EXPECT_LOG:-}" ]; then grep -q "$EXPECT_LOG" "$dir/full.log" || die "no '$EXPECT_LOG'"; fi
# The uninterrupted run's checkpoints stay; the resumed run writes its own elsewhere.
run resumed "$@" --set checkpoint.resume="$dir/ckpt/step-00000010" --set checkpoint.dir="$dir/ckpt2"
grep -E "resumed from" "$dir/resumed.log"
if [ -n "${EXPECT_LOG:-}" ]; then grep -q "$EXPECT_LOG" "$dir/resumed.log" || die "no '$EXPECT_LOG'"; fi
"$compare" --resumed "$dir/full" "$dir/resumed"
# The checkpoint after step 20 of both runs: the same state, bitwise.
"$compare" --ckpt-equal "$dir/ckpt/step-00000020" "$dir/ckpt2/step-00000020"
