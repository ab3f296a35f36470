#!/usr/bin/env bash
# `loom bench kernels --counts` without a device: its figures per launch equal
# tests/cuda/kernel_counts.csv's (each recomputed from the table's counts), every launch is
# modelled where the build has ptxas figures, the GPT-2 step's prediction is printed, and
# --config/--set beside --counts are refused in one line.
#   bench_counts.sh LOOM
set -euo pipefail
loom=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
start=$(date +%s)
CUDA_VISIBLE_DEVICES=-1 "$loom" bench kernels --counts > "$dir/out.txt" 2>&1 || { cat "$dir/out.txt"; exit 1; }
echo "bench kernels --counts took $(($(date +%s) - start)) s"
python3 "$src/tests/e2e/bench_counts_check.py" "$src/tests/cuda/kernel_counts.csv" "$dir/out.txt"
set +e
"$loom" bench kernels --counts --set train.micro_batch=2 > "$dir/refused.txt" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] && grep -q -- "--counts counts the fixed shapes of tests/cuda/kernel_counts.csv; drop --config" \
  "$dir/refused.txt" || { echo "FAIL: --counts with --set: status $rc"; cat "$dir/refused.txt"; exit 1; }
echo "bench kernels --counts: ok"
