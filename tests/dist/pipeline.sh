#!/usr/bin/env bash
# Pipeline properties beyond parity (tests/dist/parity.sh covers that):
#   1. every schedule is bitwise repeatable for a fixed layout (pp 2, twice each, and a third
#      time over NCCL's rules on the CPU, parallel.comm = "nccl-emulated"), and zb's
#      split backward, interleaved's two model chunks per stage and the V's (zbv, dualpipev;
#      llama, as a V sums gpt2's tied embedding on one stage) give 1f1b's bits (the same sums in
#      the same order), zb with every recompute policy it runs;
#   2. the tied embedding's copies on the first and last stage end bitwise equal (the trainer
#      checks and logs it; an unreduced copy would drift);
#   3. the ledger's activation bytes on stage 0 at pp 4 with m = 8 micro-batches: gpipe holds
#      8 micro-batches' activations and 1f1b p = 4 (a micro-batch's bytes measured from gpipe
#      at m = 8 against m = 1); zb p = 4 as well, each with the output gradients its W reads
#      (counted here from the shapes);
#   4. validation through the stages equals the single rank's (over MPI and over
#      nccl-emulated), and a pp 2 checkpoint loads at one rank and re-saves to the same tensors.
#   pipeline.sh LOOM COMPARE "MPIRUN... -np"
set -euo pipefail
loom=$1 compare=$2 launch=$3
. "$(dirname "$0")/../lib.sh"
test_dir
common=(--set model.n_layer=4 --set model.d_model=32 --set model.n_head=4 --set model.vocab_size=96
        --set model.seq_len=16 --set train.micro_batch=1 --set train.steps=6 --set train.warmup_steps=2
        --set train.threads=1 --set train.device=cpu --set data.val_batches=1 --set data.val_every=0)
run() {  # NAME NP ARGS...
  local name=$1 np=$2
  shift 2
  run_or_show "$dir/$name.log" ranks "$np" "$loom" train "${common[@]}" "$@" --set log.dir="$dir/$name" \
    --set export.final="$dir/$name/final.safetensors"
}
same() { "$compare" "$dir/$1" "$dir/$2" --loss-rtol 0 --norm-rtol 0 --weight-atol 0 --min-steps 6; }
for s in gpipe 1f1b zb interleaved zbv dualpipev; do
  v=()
  [ $s = interleaved ] && v=(--set parallel.pp_virtual=2)  # zbv and dualpipev take their 2 themselves
  run "${s}_a" 2 --set train.global_batch=8 --set parallel.pp=2 --set parallel.pp_schedule=$s "${v[@]}"
  run "${s}_b" 2 --set train.global_batch=8 --set parallel.pp=2 --set parallel.pp_schedule=$s "${v[@]}"
  run "${s}_emu" 2 --set train.global_batch=8 --set parallel.pp=2 --set parallel.pp_schedule=$s "${v[@]}" \
    --set parallel.comm=nccl-emulated
  same "${s}_a" "${s}_b"
  same "${s}_a" "${s}_emu"
  case $s in
    zbv | dualpipev) ;;  # a V keeps the embedding and the head on stage 0: one copy
    *) grep -q "tied embedding: the first and last stage's copies are bitwise equal" "$dir/${s}_a.log" ||
      die "no check of the tied copies" ;;
  esac
done
same 1f1b_a zb_a
same 1f1b_a interleaved_a  # each block's gradients summed over the micro-batches in order, as 1f1b
# (A V's stage 0 sums gpt2's tied embedding's two gradients in its own order: llama below.)
for arch in llama gpt2; do
  for s in 1f1b zb; do
    run "${s}_sel_$arch" 2 --set train.global_batch=8 --set parallel.pp=2 --set parallel.pp_schedule=$s \
      --set model.arch=$arch --set train.recompute=selective
  done
  same "1f1b_sel_$arch" "zb_sel_$arch"
done
for s in zbv dualpipev; do  # llama: no tied embedding, so the V's sums are 1f1b's
  run "${s}_sel_llama" 2 --set train.global_batch=8 --set parallel.pp=2 --set parallel.pp_schedule=$s \
    --set model.arch=llama --set train.recompute=selective
  # The gradient norm is summed per stage, and a V's stages hold other blocks than 1f1b's: its
  # last bit may differ (it did under another BLAS: 1.1e-16); the weights and losses may not.
  "$compare" "$dir/1f1b_sel_llama" "$dir/${s}_sel_llama" --loss-rtol 0 --norm-rtol 1e-15 --weight-atol 0 --min-steps 6
done
act() { python3 -c "import json,sys; print([json.loads(l) for l in open('$dir/$1/metrics.jsonl') if '\"loss\"' in l][-1]['mem']['act_b'])"; }
run one 4 --set train.global_batch=1 --set parallel.pp=4 --set parallel.pp_schedule=gpipe
run gpipe8 4 --set train.global_batch=8 --set parallel.pp=4 --set parallel.pp_schedule=gpipe
run f1b8 4 --set train.global_batch=8 --set parallel.pp=4 --set parallel.pp_schedule=1f1b
run zb8 4 --set train.global_batch=8 --set parallel.pp=4 --set parallel.pp_schedule=zb
one=$(act one) g=$(act gpipe8) f=$(act f1b8) z=$(act zb8)
echo "stage 0 activations: one micro-batch $one B, gpipe m=8 $g B, 1f1b m=8 $f B, zb m=8 $z B"
# A slot's bytes from gpipe's 8 against 1; 1f1b must hold exactly 4 (what is not per slot, the
# backend's own few hundred bytes, cancels).
slot=$(( (g - one) / 7 ))
[ $(( (g - one) % 7 )) -eq 0 ] && [ "$slot" -gt 0 ] && [ $((f - one)) -eq $((3 * slot)) ] ||
  die "expected gpipe to hold 8 micro-batches and 1f1b 4 (a slot: $slot B)"
# zb's stage 0 (the embedding, one gpt2 block; N = 16 rows, C = 32) keeps per slot, for W, the
# output gradients of the four linears (N x C, 4C, C, 3C) and two norms (N x C each) and the
# embedding's (N x C): 4 fp32 slots of them on top of 1f1b's, whose empty stash still takes
# an allocation's least, 64 B.
stash=$(( (16 * (32 + 128 + 32 + 32 + 96 + 32) + 16 * 32) * 4 ))
[ $((z - f)) -eq $((4 * stash - 64)) ] ||
  die "zb holds $((z - f)) B more than 1f1b, expected 4 slots of $stash B"
echo "one slot: $slot B; gpipe holds 8, 1f1b 4, zb 4 (+ $stash B each for W)"
grep -E "pipeline:" "$dir/f1b8.log"
# 4. Validation runs forward through the stages: the last val_loss equals the single rank's;
#    and a pp 2 checkpoint (without the tied copy) loads at one rank and saves the same tensors.
run val1 1 --set train.global_batch=8 --set data.val_every=3 --set checkpoint.dir="$dir/ck1" --set checkpoint.every=6
run valpp 2 --set train.global_batch=8 --set data.val_every=3 --set parallel.pp=2 --set checkpoint.dir="$dir/ckpp" \
  --set checkpoint.every=6
"$compare" --val "$dir/val1" "$dir/valpp" 1e-6
run valpp_emu 2 --set train.global_batch=8 --set data.val_every=3 --set parallel.pp=2 --set parallel.comm=nccl-emulated
"$compare" --val "$dir/val1" "$dir/valpp_emu" 1e-6
run reload 1 --set train.global_batch=8 --set checkpoint.resume="$dir/ckpp/step-00000006" --set checkpoint.dir="$dir/ck2" \
  --set checkpoint.every=6
"$compare" --ckpt-equal "$dir/ckpp/step-00000006" "$dir/ck2/step-00000006"
echo ok
