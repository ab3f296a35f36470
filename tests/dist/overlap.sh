#!/usr/bin/env bash
# A dp=2 run's gradient all-reduces must overlap backward: in its trace some bucket's
# all-reduce completes before the step's backward ends, and its exposed communication is
# below the same run with one bucket (which cannot start before backward is over).
#   overlap.sh LOOM COMPARE "MPIRUN..."
set -euo pipefail
loom=$1 compare=$2 mpirun=$3
. "$(dirname "$0")/../lib.sh"
test_dir
# Blocks wide enough that a bucket's all-reduce can finish while the next block computes.
common=(--set train.device=cpu --set model.n_layer=6 --set model.d_model=256 --set model.seq_len=64
        --set train.micro_batch=4 --set train.global_batch=8 --set train.steps=8 --set train.threads=1
        --set data.val_batches=0 --set parallel.dp=2)
# Timing on a shared machine: a loaded moment can stretch the exposed time past one bucket's,
# so up to three tries; code that overlaps nothing fails all three.
for attempt in 1 2 3; do
  run_or_show "$dir/log" $mpirun -np 2 "$loom" train "${common[@]}" --set parallel.bucket_mb=1 \
    --set log.trace=true \
    --set log.dir="$dir/buckets$attempt"
  run_or_show "$dir/one.log" $mpirun -np 2 "$loom" train "${common[@]}" --set parallel.bucket_mb=1000 \
    --set log.dir="$dir/one$attempt"
  grep "layout" "$dir/log" "$dir/one.log"
  if "$compare" --trace "$dir/buckets$attempt/trace.rank0.json" "$dir/buckets$attempt/metrics.jsonl" \
    "$dir/one$attempt/metrics.jsonl"; then exit 0; fi
  echo "attempt $attempt: no overlap measured"
done
exit 1
