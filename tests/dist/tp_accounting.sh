#!/usr/bin/env bash
# Tensor parallel at tp=4, sequence parallel off and on: per-step tp communication from the
# group's counters against the analytic count, the activation bytes sequence parallelism
# saves against the formula (both stated in tools/compare_runs.cpp), and the step-time
# split (phases add up, blocking tp collectives charged as exposed communication).
#   tp_accounting.sh LOOM COMPARE "MPIRUN..." ARCH
set -euo pipefail
loom=$1 compare=$2 mpirun=$3 arch=$4
. "$(dirname "$0")/../lib.sh"
test_dir
B=2 T=16 C=32 L=3 TP=4 A=2
common=(--set model.arch="$arch" --set model.n_layer=$L --set model.d_model=$C --set model.n_head=8
        --set model.vocab_size=96 --set model.seq_len=$T --set model.d_ff=128 --set train.micro_batch=$B
        --set train.global_batch=$((B * A)) --set train.steps=2 --set train.threads=1 --set data.val_batches=0
        --set parallel.tp=$TP --set train.device=cpu)
[ "$arch" = llama ] && common+=(--set model.n_kv_head=4)
for sp in false true; do
  run_or_show "$dir/$sp.log" $mpirun -np $TP "$loom" train "${common[@]}" --set parallel.sp=$sp \
    --set log.dir="$dir/sp_$sp"
done
"$compare" --tp "$dir/sp_false" "$dir/sp_true" $B $T $C $L $TP $A "$arch"
"$compare" --split "$dir/sp_false"
"$compare" --split "$dir/sp_true"
