#!/usr/bin/env bash
# mpirun SIGKILLed (an OOM killer, `kill -9`, a lost login node): its ranks outlive it by a
# second or two, and rank 0 used to commit a checkpoint every step of them (9 more, 100 ms
# steps). Now a rank whose launcher is gone commits nothing: the newest checkpoint is the one
# committed before the kill, and no rank is left running.
#   orphaned_ranks.sh LOOM "MPIRUN..."
set -uo pipefail
loom=$1 mpirun=$2
. "$(dirname "$0")/../lib.sh"
test_dir
marker="orphaned-ranks-$$"
on_exit 'pkill -9 -f "$marker" 2> /dev/null'
cd "$dir"
# shellcheck disable=SC2086
$mpirun -np 2 "$loom" train --set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 \
  --set model.vocab_size=64 --set model.seq_len=8 --set train.global_batch=4 --set train.micro_batch=2 \
  --set train.threads=1 --set train.device=cpu --set data.val_batches=0 --set train.steps=100000 \
  --set checkpoint.every=1 --set checkpoint.keep=100000 --set checkpoint.async=false --set fault.slow=0:100 \
  --set checkpoint.dir="$dir/ck" --set log.dir="$dir/$marker" > run.log 2>&1 &
launcher=$!
for _ in $(seq 600); do [ "$(ls -d ck/step-*/manifest.json 2> /dev/null | wc -l)" -ge 3 ] && break; sleep 0.1; done
kill -9 $launcher
at=$(ls -d ck/step-*/manifest.json | wc -l)
sleep 4
after=$(ls -d ck/step-*/manifest.json | wc -l)
echo "checkpoints committed when mpirun was killed: $at; 4 s later: $after"
[ "$at" -ge 3 ] || { tail -5 run.log; die "the job never committed 3 checkpoints"; }
# One may land in the instant of the kill; none after it.
[ "$after" -le $((at + 1)) ] || die "orphaned ranks committed $((after - at)) checkpoints"
no_processes_left "$marker" 2
echo "orphaned ranks: nothing committed"
