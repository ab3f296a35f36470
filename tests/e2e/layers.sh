#!/usr/bin/env bash
# The layers the build enforces: every layer's include root holds its own folder and the ones
# below it and nothing above, and a model-layer source that includes the trainer fails to
# compile while the same source including the runtime compiles.
#   layers.sh BUILD_DIR
set -euo pipefail
build=$1
layers=(runtime kernels model optim parallel checkpoint data plan train launch)
bad=0
for ((i = 0; i < ${#layers[@]}; i++)); do
  root=$build/layers/${layers[i]}
  for ((j = 0; j < ${#layers[@]}; j++)); do
    seen=0
    [ -e "$root/${layers[j]}" ] && seen=1
    want=$((j <= i ? 1 : 0))
    if [ $seen -ne $want ]; then
      echo "FAIL: layer ${layers[i]} $([ $want = 1 ] && echo lacks || echo sees) ${layers[j]}/"
      bad=1
    fi
  done
done
if cmake --build "$build" --target layer_probe_down > /tmp/layers_down.$$ 2>&1; then
  echo "ok: a model-layer source includes runtime/config.h"
else
  echo "FAIL: the downward probe did not build:" && tail -5 /tmp/layers_down.$$ && bad=1
fi
if cmake --build "$build" --target layer_probe_up > /tmp/layers_up.$$ 2>&1; then
  echo "FAIL: a model-layer source included train/trainer.h and built" && bad=1
elif grep -q "train/trainer.h: No such file" /tmp/layers_up.$$; then
  echo "ok: a model-layer source that includes train/trainer.h fails to compile"
else
  echo "FAIL: the upward probe failed for another reason:" && tail -5 /tmp/layers_up.$$ && bad=1
fi
# The model takes ModelDims, never the whole Config: only model_dims.h builds one from it.
src=$(cd "$(dirname "$0")/../.." && pwd)
if grep -nE '\bConfig\b' "$src"/model/*.h "$src"/model/*.cpp | grep -v '^[^:]*/model_dims\.h:' | grep -v '//'; then
  echo "FAIL: model/ names the whole Config (lines above); give it what it needs through ModelDims" && bad=1
else
  echo "ok: model/ reads ModelDims, not Config"
fi
# Data parallel takes DataParallelOptions: only data_parallel_options (ddp.cpp) reads the Config.
dp_src=("$src"/parallel/{data_parallel.h,ddp.h,grad_tree.h,grad_tree.cpp,tied_head.h,tied_head.cpp} "$src"/parallel/zero*.{h,cpp})
if grep -nE '\bConfig\b' "${dp_src[@]}" | grep -v 'data_parallel_options(const Config' | grep -v '//'; then
  echo "FAIL: data parallel names the whole Config (lines above); give it what it needs through DataParallelOptions" && bad=1
else
  echo "ok: data parallel reads DataParallelOptions, not Config"
fi
# The reference attention kernels (kernels/cuda/reference/) are the tests' and the benchmark's:
# nothing that trains includes them.
if (cd "$src" && grep -rlE '#include "kernels/cuda/reference/' runtime kernels model optim parallel checkpoint data plan \
  train launch | grep -vE '^kernels/cuda/reference/|^train/bench_cuda\.cpp$'); then
  echo "FAIL: the sources above include the reference kernels; training runs kernels/cuda/ops_cuda.h's" && bad=1
else
  echo "ok: only the tests and the benchmark include kernels/cuda/reference/"
fi
rm -f /tmp/layers_down.$$ /tmp/layers_up.$$
exit $bad
