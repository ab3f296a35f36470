#!/usr/bin/env bash
# Results that do not depend on the layout, bit for bit:
#   loss:      by default, the same config over 1, 2 and 4 ranks, data parallel under ZeRO 0-3
#              and pipeline parallel, gives the same step-1 loss to the last bit (each
#              micro-batch's loss is added to the total exactly, so neither the ranks that
#              computed them nor the order the ranks' sums meet changes a bit);
#   invariant: with parallel.invariant = true the gradients are summed in one canonical tree,
#              so every step's loss and gradient norm and the exported weights are the same
#              bytes in every layout of the matrix below (dp 1, 2, 4 under DDP and ZeRO 1-3 over
#              MPI and nccl-emulated; pp 2 and 4 under all six schedules; bf16; MoE at ep 1;
#              around a fixed tp; the CUDA kernels in the emulation; gpt2's tied embeddings
#              under DDP, ZeRO 1-3 and pp 2, the head and the embedding on one rank or two; around
#              a fixed cp under DDP, ZeRO 1-3 and pp, gpt2's too, cp 2 and 4, the tied head sharing
#              the rank under ZeRO-2/3, cp 2 x dp 4 under ZeRO-2 for a sub-group's tree reduce-scatter
#              of more than one exchange), and a dp 4 checkpoint resumed at dp 2 ends with the bytes
#              of the run that never stopped.
#   invariant.sh LOOM "MPIRUN..."
set -uo pipefail
loom=$1 mpirun=$2
. "$(dirname "$0")/../lib.sh"
test_dir
cd "$dir"
# 16 micro-batches of one sequence: 16 sums on one rank, 8 or 4 per rank on 2 or 4.
common=(--set model.arch=llama --set model.n_layer=2 --set model.d_model=32 --set model.n_head=4
        --set model.vocab_size=96 --set model.seq_len=16 --set train.global_batch=16 --set train.micro_batch=1
        --set train.steps=1 --set train.threads=1 --set train.device=cpu --set data.val_batches=0)
run() {  # NAME NP [--set ...]
  local name=$1 np=$2
  shift 2
  if ! timeout 120 $mpirun -np "$np" "$loom" train "${common[@]}" --set log.dir=$name "$@" > $name.log 2>&1 < /dev/null; then
    fail "$name did not run"
    tail -3 $name.log
    return
  fi
  grep -o '"loss":[^,]*' $name/metrics.jsonl | head -1 > $name.loss
}

echo "loss"
run loss.one 1
run loss.dp2 2 --set parallel.dp=2
run loss.dp4 4 --set parallel.dp=4
run loss.dp2_zero1 2 --set parallel.dp=2 --set parallel.zero=1
run loss.dp2_zero2 2 --set parallel.dp=2 --set parallel.zero=2
run loss.dp4_zero3 4 --set parallel.dp=4 --set parallel.zero=3
run loss.pp2 2 --set parallel.pp=2
run loss.pp2_dp2_gpipe 4 --set parallel.pp=2 --set parallel.dp=2 --set parallel.pp_schedule=gpipe
want=$(cat loss.one.loss 2> /dev/null)
[ -n "$want" ] || fail "the single rank wrote no step-1 loss"
echo "one rank: $want"
for f in loss.*.loss; do
  [ "$f" = loss.one.loss ] && continue
  got=$(cat "$f")
  if [ "$got" = "$want" ]; then echo "ok: ${f%.loss}: the same bits"; else fail "${f%.loss}: $got, not $want"; fi
done

echo "invariant"
# Each run: every step's loss, gradient norm and MoE statistics, and the exported weights' bytes.
steps() {  # RUN FROM: the steps from FROM on, each step's loss, gradient norm and MoE statistics
  awk -v from=$2 'match($0, /"step":[0-9]*,"loss":[^,]*,"grad_norm":[^,]*/) {
    line = substr($0, RSTART, RLENGTH); split(line, f, /[:,]/); if (f[2] < from) next
    if (match($0, /"aux_loss":[^]]*]/)) line = line " " substr($0, RSTART, RLENGTH)
    print line }' $1/metrics.jsonl
}
same() {  # REFERENCE NAME [FROM]
  local ref=$1 name=$2 from=${3:-1}
  [ -s $name/metrics.jsonl ] || return
  if ! diff <(steps $ref $from) <(steps $name $from) > $name.diff; then
    fail "$name: losses or gradient norms differ from $ref's:"
    head -4 $name.diff
  elif ! cmp -s $ref.safetensors $name.safetensors; then
    fail "$name: the exported weights differ from $ref's"
  else
    echo "ok: $name: $(grep -c '"loss"' $name/metrics.jsonl) steps and the weights, the same bits as $ref"
  fi
}
common=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=4 --set model.vocab_size=96
        --set model.seq_len=16 --set train.global_batch=16 --set train.micro_batch=1 --set train.steps=4
        --set train.warmup_steps=1 --set train.threads=1 --set data.val_batches=0 --set parallel.invariant=true)
# The matrix, one case a line: NAME REFERENCE NP, then the case's keys. A reference is a case of
# its own (REFERENCE "-": the single rank, run first); a case is compared with its reference.
# base: llama (untied), 2 blocks, CPU fp32; l4: 4 blocks (for 2 model chunks a stage); moe:
# experts every second block at ep 1; emu: the CUDA kernels in the emulation (head dim 32).
l4="model.n_layer=4"
moe="model.moe.num_experts=4 model.moe.every=2"
emu="train.device=cuda-emulated model.d_model=64 model.n_head=2 train.global_batch=8 train.steps=2"
cases="
one          -            1
dp2          one          2  parallel.dp=2
dp4          one          4  parallel.dp=4
dp2_zero1    one          2  parallel.dp=2 parallel.zero=1
dp4_zero1    one          4  parallel.dp=4 parallel.zero=1
dp2_zero2    one          2  parallel.dp=2 parallel.zero=2
dp4_zero2    one          4  parallel.dp=4 parallel.zero=2
dp2_zero3    one          2  parallel.dp=2 parallel.zero=3
dp4_zero3    one          4  parallel.dp=4 parallel.zero=3
dp4_nccl     one          4  parallel.dp=4 parallel.comm=nccl-emulated
dp4_z1_nccl  one          4  parallel.dp=4 parallel.zero=1 parallel.comm=nccl-emulated
pp2          one          2  parallel.pp=2
pp2_dp2      one          4  parallel.pp=2 parallel.dp=2 parallel.pp_schedule=gpipe
one_l4       -            1  $l4
pp2_zb       one_l4       2  $l4 parallel.pp=2 parallel.pp_schedule=zb
pp2_zbv      one_l4       2  $l4 parallel.pp=2 parallel.pp_schedule=zbv
pp2_dualpipe one_l4       2  $l4 parallel.pp=2 parallel.pp_schedule=dualpipev
pp2_inter    one_l4       2  $l4 parallel.pp=2 parallel.pp_schedule=interleaved parallel.pp_virtual=2
pp4          one_l4       4  $l4 parallel.pp=4
pp4_gpipe    one_l4       4  $l4 parallel.pp=4 parallel.pp_schedule=gpipe
bf16         -            1  train.dtype=bf16
bf16_dp4     bf16         4  train.dtype=bf16 parallel.dp=4 parallel.zero=3
moe          -            1  $moe
moe_dp4      moe          4  $moe parallel.dp=4
moe_pp2      moe          2  $moe parallel.pp=2
tp2          -            2  parallel.tp=2
tp2_dp2      tp2          4  parallel.tp=2 parallel.dp=2
emu          -            1  $emu
emu_dp2      emu          2  $emu parallel.dp=2
emu_dp2_nccl emu          2  $emu parallel.dp=2 parallel.comm=nccl-emulated
gpt2         -            1  model.arch=gpt2
gpt2_dp2     gpt2         2  model.arch=gpt2 parallel.dp=2
gpt2_dp4     gpt2         4  model.arch=gpt2 parallel.dp=4 parallel.zero=2
gpt2_dp4_z1  gpt2         4  model.arch=gpt2 parallel.dp=4 parallel.zero=1
gpt2_dp4_ddp gpt2         4  model.arch=gpt2 parallel.dp=4
gpt2_dp2_z3  gpt2         2  model.arch=gpt2 parallel.dp=2 parallel.zero=3
gpt2_pp2     gpt2         2  model.arch=gpt2 parallel.pp=2
gpt2_pp2_dp2 gpt2         4  model.arch=gpt2 parallel.pp=2 parallel.dp=2 parallel.zero=2
gpt2_pp2_dp4 gpt2         8  model.arch=gpt2 parallel.pp=2 parallel.dp=4 parallel.zero=3
gpt2_pp2_dp4_ddp gpt2     8  model.arch=gpt2 parallel.pp=2 parallel.dp=4
gpt2_l4      -            1  model.arch=gpt2 $l4
gpt2_zbv     gpt2_l4      2  model.arch=gpt2 $l4 parallel.pp=2 parallel.pp_schedule=zbv
gpt2_inter   gpt2_l4      2  model.arch=gpt2 $l4 parallel.pp=2 parallel.pp_schedule=interleaved parallel.pp_virtual=2
gpt2_pp4     gpt2_l4      4  model.arch=gpt2 $l4 parallel.pp=4 parallel.pp_schedule=gpipe
cp2          -            2  parallel.cp=2
cp2_dp2      cp2          4  parallel.cp=2 parallel.dp=2
cp2_dp4_z1   cp2          8  parallel.cp=2 parallel.dp=4 parallel.zero=1
cp2_pp2      cp2          4  parallel.cp=2 parallel.pp=2
cp2_z2       cp2          2  parallel.cp=2 parallel.zero=2
cp2_dp2_z2   cp2          4  parallel.cp=2 parallel.dp=2 parallel.zero=2
cp2_dp2_z3   cp2          4  parallel.cp=2 parallel.dp=2 parallel.zero=3
cp2_dp4_z2   cp2          8  parallel.cp=2 parallel.dp=4 parallel.zero=2
gpt2_cp2     -            2  model.arch=gpt2 parallel.cp=2
gpt2_cp2_dp2 gpt2_cp2     4  model.arch=gpt2 parallel.cp=2 parallel.dp=2
gpt2_cp2_pp2_z2 gpt2_cp2  4  model.arch=gpt2 parallel.cp=2 parallel.pp=2 parallel.zero=2
gpt2_cp2_z2  gpt2_cp2     2  model.arch=gpt2 parallel.cp=2 parallel.zero=2
gpt2_cp2_dp2_z2 gpt2_cp2  4  model.arch=gpt2 parallel.cp=2 parallel.dp=2 parallel.zero=2
gpt2_cp2_dp2_z3 gpt2_cp2  4  model.arch=gpt2 parallel.cp=2 parallel.dp=2 parallel.zero=3
gpt2_l4_cp2  -            2  model.arch=gpt2 $l4 parallel.cp=2
gpt2_cp2_zbv_z2 gpt2_l4_cp2 4  model.arch=gpt2 $l4 parallel.cp=2 parallel.pp=2 parallel.pp_schedule=zbv parallel.zero=2
gpt2_cp2_dualpipe_z3 gpt2_l4_cp2 4  model.arch=gpt2 $l4 parallel.cp=2 parallel.pp=2 parallel.pp_schedule=dualpipev parallel.zero=3
gpt2_cp4     -            4  model.arch=gpt2 parallel.cp=4
gpt2_cp4_dp2_z2 gpt2_cp4  8  model.arch=gpt2 parallel.cp=4 parallel.dp=2 parallel.zero=2
"
while read -r name ref np keys; do
  [ -n "$name" ] || continue
  sets=(--set model.arch=llama --set train.device=cpu)
  for k in $keys; do sets+=(--set "$k"); done
  run $name $np "${sets[@]}" --set export.final=$name.safetensors
  [ "$ref" = - ] || same $ref $name
done <<< "$cases"
# Threads: the CPU's GEMMs are cut in blocks by shape, not by thread count (512 tokens a
# micro-batch: 2 blocks of rows), so 1, 2 and 3 threads give the same bits.
th=(--set model.arch=llama --set train.device=cpu --set model.d_model=64 --set model.seq_len=64
    --set train.micro_batch=8 --set train.global_batch=16)
run threads1 1 "${th[@]}" --set export.final=threads1.safetensors
for t in 2 3; do
  run threads$t 1 "${th[@]}" --set train.threads=$t --set export.final=threads$t.safetensors
  same threads1 threads$t
done
# Open MPI's own all-reduce made a ring: loom's tree does not use it (its in-place default at
# these sizes, libnbc's binomial tree, happens to add as the canonical tree does at powers of
# two, so only a ring shows an all-reduce put back in the tree's place).
export OMPI_MCA_coll_libnbc_iallreduce_algorithm=1
run dp4_ring 4 --set model.arch=llama --set train.device=cpu --set parallel.dp=4 --set export.final=dp4_ring.safetensors
run dp4_z1_ring 4 --set model.arch=llama --set train.device=cpu --set parallel.dp=4 --set parallel.zero=1 \
  --set export.final=dp4_z1_ring.safetensors
unset OMPI_MCA_coll_libnbc_iallreduce_algorithm
same one dp4_ring
same one dp4_z1_ring
# A dp 4 checkpoint after step 2, resumed at dp 2: steps 3 and 4 and the weights are the bytes of
# the run that never stopped.
run ckpt_dp4 4 --set model.arch=llama --set train.device=cpu --set parallel.dp=4 --set checkpoint.dir=ck4 \
  --set checkpoint.every=2
run resumed_dp2 2 --set model.arch=llama --set train.device=cpu --set parallel.dp=2 \
  --set checkpoint.resume=ck4/step-00000002 --set checkpoint.dir=ck2 --set export.final=resumed_dp2.safetensors
same one resumed_dp2 3
# The tree differs from today's sums (otherwise the comparisons above could not fail): the same
# dp 4 run without it.
run plain_dp4 4 --set model.arch=llama --set train.device=cpu --set parallel.invariant=false --set parallel.dp=4 \
  --set export.final=plain_dp4.safetensors
cmp -s one.safetensors plain_dp4.safetensors && fail "dp 4 without the tree gave the single rank's bytes too"

echo "compare"
# loom compare: the layout against the smallest with its tp (dp 1, pp 1, ZeRO 0), as a user runs it.
args=(--set model.arch=llama --set model.n_layer=2 --set model.d_model=32 --set model.n_head=4 --set model.vocab_size=96
      --set model.seq_len=16 --set train.global_batch=16 --set train.micro_batch=1 --set train.threads=1
      --set train.device=cpu --set data.val_batches=0)
"$loom" compare --launcher "$mpirun -np" --out cmp_tree "${args[@]}" --set parallel.invariant=true \
  --set parallel.dp=2 --set parallel.pp=2 --set parallel.zero=1 > cmp_tree.log 2>&1 < /dev/null ||
  fail "compare in the mode exited $?: $(tail -2 cmp_tree.log)"
grep -q "^the same bits: the losses and gradient norms of 3 steps, and all 21 tensors" cmp_tree.log ||
  fail "compare in the mode: $(tail -1 cmp_tree.log)"
"$loom" compare --launcher "$mpirun -np" --out cmp_plain "${args[@]}" --set parallel.dp=4 > cmp_plain.log 2>&1 \
  < /dev/null || fail "compare outside the mode exited $?: $(tail -2 cmp_plain.log)"
grep -q "^within the tolerances" cmp_plain.log && grep -q "the bits differ from step 1 on" cmp_plain.log ||
  fail "compare outside the mode: $(tail -2 cmp_plain.log)"
"$loom" compare --launcher "$mpirun -np" --out cmp_tree "${args[@]}" > cmp_again.log 2>&1 < /dev/null
[ $? = 2 ] && grep -q "is not empty; give a new directory" cmp_again.log || fail "compare into a used --out"

finish
