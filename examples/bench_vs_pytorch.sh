#!/usr/bin/env bash
# loom vs PyTorch on GPT-2 124M (B=4, T=256, fp32), same machine, same threads, one run.
# Prints tokens/s for both, the ratio, and loom's MFU against this machine's GEMM peak.
# Needs Debian's python3-torch and python3-numpy (apt-get install python3-torch).
#   examples/bench_vs_pytorch.sh [STEPS] [THREADS...]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-4}
shift || true
if [ $# -gt 0 ]; then threads=("$@"); else threads=(1 2); fi
py=/usr/bin/python3
printf "%-8s %14s %14s %8s %8s\n" threads "loom tok/s" "torch tok/s" ratio "loom MFU"
for t in "${threads[@]}"; do
  l=$(build/loom bench train --config examples/configs/gpt2_124m.toml --set train.threads="$t" \
        --set train.steps="$steps" --set log.dir= | tail -1)
  p=$(OMP_NUM_THREADS=$t $py examples/bench_pytorch.py "$t" "$steps" | tail -1)
  lt=$(echo "$l" | sed 's/.*"tokens_per_s": \([0-9.e+]*\).*/\1/')
  mfu=$(echo "$l" | sed 's/.*"mfu": \([0-9.e+-]*\).*/\1/')
  pt=$(echo "$p" | sed 's/.*"tokens_per_s": \([0-9.e+]*\).*/\1/')
  awk -v t="$t" -v l="$lt" -v p="$pt" -v m="$mfu" 'BEGIN { printf "%-8s %14.1f %14.1f %7.2fx %7.1f%%\n", t, l, p, l / p, 100 * m }'
done
