#!/usr/bin/env bash
# `loom bench kernels --counts` without a device: its figures per launch equal
# tests/cuda/kernel_counts.csv's (each recomputed from the table's counts), every launch is
# modelled where the build has ptxas figures, the GPT-2 step's prediction is printed, and
# --config/--set beside --counts are refused in one line. --write-cluster writes the step model's
# attention, element-wise and optimizer rates into a copy of examples/clusters/h200.toml, each
# the figure the step line printed, the file's other lines kept.
#   bench_counts.sh LOOM
set -euo pipefail
loom=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
. "$(dirname "$0")/../lib.sh"
test_dir
start=$(date +%s)
# A build with CUDA has ptxas figures (the model, and --write-cluster); one without counts only.
write=()
CUDA_VISIBLE_DEVICES=-1 "$loom" info | grep -q "^CUDA kernels: in this build" && write=(--write-cluster "$dir/predicted.toml")
rc=0
CUDA_VISIBLE_DEVICES=-1 "$loom" bench kernels --counts "${write[@]}" > "$dir/out.txt" 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat "$dir/out.txt"; exit 1; }
if [ ${#write[@]} -gt 0 ] && grep -q "no ptxas figures" "$dir/out.txt"; then
  echo "FAIL: a CUDA build without ptxas figures"; exit 1
fi
echo "bench kernels --counts took $(($(date +%s) - start)) s"
python3 "$src/tests/e2e/bench_counts_check.py" "$src/tests/cuda/kernel_counts.csv" "$dir/out.txt"
if ! grep -q "no ptxas figures" "$dir/out.txt"; then
  for key in attention_tflops mem_bw_gbs optimizer_gbs; do
    grep -q "^$key = [0-9.e+]*  # predicted by the kernel time model" "$dir/predicted.toml" ||
      { cat "$dir/predicted.toml"; die "$key not written"; }
  done
  printed=$(sed -n 's/.*attention [0-9.]* ms = \([0-9]*\) TFLOP\/s.*/\1/p' "$dir/out.txt")
  written=$(sed -n 's/^attention_tflops = \([0-9.e+]*\) .*/\1/p' "$dir/predicted.toml")
  [ -n "$printed" ] && python3 -c "import sys; sys.exit(abs(round($written) - $printed) > 1)" ||
    die "attention printed at '$printed' TFLOP/s, written as '$written'"
  grep -q '^name = "H200 SXM x 8"' "$dir/predicted.toml" && grep -q '^\[intra\]' "$dir/predicted.toml" ||
    { cat "$dir/predicted.toml"; die "the copy lost h200.toml's other lines"; }
fi
set +e
"$loom" bench kernels --write-cluster "$dir/x.toml" > "$dir/refused.txt" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] && grep -q -- "--write-cluster needs --counts" "$dir/refused.txt" ||
  { cat "$dir/refused.txt"; die "--write-cluster without --counts: status $rc"; }
set +e
"$loom" bench kernels --counts --set train.micro_batch=2 > "$dir/refused.txt" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] && grep -q -- "--counts counts the fixed shapes of tests/cuda/kernel_counts.csv; drop --config" \
  "$dir/refused.txt" || { cat "$dir/refused.txt"; die "--counts with --set: status $rc"; }
echo "bench kernels --counts: ok"
