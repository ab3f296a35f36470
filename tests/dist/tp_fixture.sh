#!/usr/bin/env bash
# Tensor parallel from and to Hugging Face weights: the PyTorch parity fixture trained at
# tp=2 (with and without sequence parallel) must still give PyTorch's losses and weights, so
# init.from splits the full tensors and export.final gathers them back exactly.
#   tp_fixture.sh LOOM COMPARE "MPIRUN..." FIXTURE_DIR SP
set -euo pipefail
loom=$1 compare=$2 mpirun=$3 fixture=$4 sp=$5
. "$(dirname "$0")/../lib.sh"
test_dir
run_or_show "$dir/log" $mpirun -np 2 "$loom" train --config "$fixture/config.toml" \
  --set train.device=cpu --set data.path="$fixture/tokens.bin" \
  --set data.val_path="$fixture/tokens.bin" --set init.from="$fixture/init.safetensors" \
  --set parallel.tp=2 --set parallel.sp="$sp" --set log.dir="$dir" --set export.final="$dir/final.safetensors"
"$compare" --fixture "$dir" "$fixture"
