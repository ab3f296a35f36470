#!/usr/bin/env bash
# Plants one bug at a time in kernels/cuda/ and shows which emulated kernel test catches it:
# plain, under AddressSanitizer and under ThreadSanitizer. Each mutation is undone on exit.
# Not part of ctest (it rebuilds three test binaries per mutation, a few minutes in all).
#   tests/cuda/mutations.sh [BUILD_DIR [NAME_SUBSTRING]]
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build}"
only="${2:-}"
# It restores kernels/cuda from git after each mutation: uncommitted work there would be lost.
if ! git -C "$root" diff --quiet -- kernels/cuda; then
  echo "kernels/cuda has uncommitted changes: commit or stash them first" >&2
  exit 2
fi
restore() { git -C "$root" checkout -- kernels/cuda; }
trap restore EXIT

# name | file | text | replacement | gtest filter; \n in a text stands for a newline.
mutations=(
  "removed __syncthreads after dQ's K/V tile loads|kernels/cuda/reference/attention_wmma.cu|(vs, base + (H + KV + kvh) * D, row, k0, T);\n    __syncthreads();\n    warp_abt<D>(ss + wr * kLS, qs + wr * L::LD, ks);\n    warp_abt<D>(dps|(vs, base + (H + KV + kvh) * D, row, k0, T);\n    warp_abt<D>(ss + wr * kLS, qs + wr * L::LD, ks);\n    warp_abt<D>(dps|*CudaAttention*"
  "tile row bound off by one (r0 + r <= T)|kernels/cuda/reference/attention_wmma.cu|if (r0 + r < T) v =|if (r0 + r <= T) v =|*CudaAttention*"
  "stored row bound off by one (t > T)|kernels/cuda/reference/attention_wmma.cu|if (t >= T) break;|if (t > T) break;|*CudaAttention*"
  "the column sums' += turned into = (weight and bias gradients)|kernels/cuda/common.cuh|out[c] = Accumulate ? out[c] + t : t;|out[c] = t;|*Norms*:*BiasBackward*"
  "memory-bound: a warp sum missing its last lane exchange|kernels/cuda/common.cuh|for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync|for (int o = 16; o > 1; o >>= 1) v += __shfl_xor_sync|*Norms*"
  "memory-bound: a row's last column dropped where C % 8 != 0|kernels/cuda/common.cuh|    if (c + k < C) row[c + k] = h[k];|    if (c + k < C - 1) row[c + k] = h[k];|*Norms*"
  "memory-bound: a norm row's last slice dropped where C % 256 != 0|kernels/cuda/norm.cu|return (C + kSliceCols - 1) / kSliceCols;|return C / kSliceCols;|*Norms*"
  "memory-bound: LayerNorm's variance counts the columns past C|kernels/cuda/norm.cu|      if (c + k < C) q +=|      q +=|*Norms*"
  "memory-bound: LayerNorm's variance drops the slices' means (Chan's term)|kernels/cuda/norm.cu|m2 += part[p][u][1] + cols * d * d;|m2 += part[p][u][1] + 0.0f * (cols * d * d);|*Norms*"
  "memory-bound: a pointwise tail's last element dropped|kernels/cuda/elementwise.cu|    if (i + k < n) p[i + k] = b(x[k]);|    if (i + k < n - 1) p[i + k] = b(x[k]);|*Pointwise*"
  "memory-bound: SwiGLU's words read the gate twice|kernels/cuda/elementwise.cu|    unpack8(u, load128(inp + n * 2 * F + F + j));|    unpack8(u, load128(inp + n * 2 * F + j));|*Pointwise*"
  "memory-bound: the loss skips a row's unaligned head|kernels/cuda/loss_optim.cu|for (int c = threadIdx.x; c < in.head; c += kThreads) softmax_add|for (int c = threadIdx.x; c < 0; c += kThreads) softmax_add|*CrossEntropy*"
  "cp blocks: dQ's diagonal off by one (kpos < qpos)|kernels/cuda/attention_block.cu|const bool seen = kp[8 * n + 2 * t + i % 2] <= (i < 2 ? p0 : p1);|const bool seen = kp[8 * n + 2 * t + i % 2] < (i < 2 ? p0 : p1);|*CudaCp*"
  "cp blocks: gradients written instead of added into|kernels/cuda/attention_block.cu|      row[8 * n] += acc[n][2 * half] * scale, row[8 * n + 1] += acc[n][2 * half + 1] * scale;|      row[8 * n] = acc[n][2 * half] * scale, row[8 * n + 1] = acc[n][2 * half + 1] * scale;|*CudaCp*"
  "cp blocks: the running max of the blocks before dropped|kernels/cuda/attention_block.cu|m[half] = stats[2 * r] / scale;|m[half] = -INFINITY;|*CudaCp*"
  "cp blocks: a key tile used before its cp.async wait|kernels/cuda/attention_block.cu|    cp_async_wait<0>();\n    __syncthreads();  // the next tile has landed|    __syncthreads();  // the next tile has landed|*CudaCp*"
  "flash forward: the mask's keys counted from the 64-key tile, not its 32-key chunk|kernels/cuda/attention_flash.cu|const int key = kc0 + 8 * n|const int key = k0 + 8 * n|*FlashAttention*:*CudaAttention*"
  "flash dQ from the stored dS: a tile takes the chunks of the 32-row group after its own (a dS never written)|kernels/cuda/attention_flash_ds.cu|live[r] = rt < T && kc0 <=|live[r] = rt < T && kc0 - 32 <=|*FlashAttentionStoredDs*"
  "norm backward: the block's sum of its row groups' partials drops the last group|kernels/cuda/norm.cu|for (int h = 0; h < groups; ++h) {|for (int h = 0; h < groups - 1; ++h) {|*Norms*"
  "norm backward: a row group past 32 rows keeps its first 32 rows' mean and rstd|kernels/cuda/norm.cu|if (i % 32 == 0) {|if (i == 0) {|*NormBackwardRowGroups*"
  "embedding: a frequent token's last piece dropped|kernels/cuda/elementwise.cu|for (int r = p.first; r < p.first + p.count; ++r)|for (int r = p.first; r < p.first + p.count - 1; ++r)|*Embedding*"
  "memory-bound: the word column sums drop a row phase|kernels/cuda/common.cuh|for (int p = 0; p < kColPhases; ++p) sum += is_b|for (int p = 1; p < kColPhases; ++p) sum += is_b|*Norms*:*BiasBackward*"
)

for m in "${mutations[@]}"; do
  IFS='|' read -r name file text repl filter <<<"$m"
  [[ -n "$only" && "$name" != *"$only"* ]] && continue
  restore
  python3 - "$root/$file" "$text" "$repl" <<'PY' || { echo "mutation '$name': text not found"; exit 1; }
import sys
path, old, new = (a.replace("\\n", "\n") for a in sys.argv[1:4])
s = open(path).read()
if old not in s:
    sys.exit(1)
open(path, "w").write(s.replace(old, new, 1))
PY
  ninja -C "$build" tests/loom_emu_tests tests/loom_emu_tests_address tests/loom_emu_tests_thread >/dev/null || {
    echo "mutation '$name': does not build"; continue; }
  line="$name:"
  for v in "" _address _thread; do
    log="/tmp/mutation$v.log"
    if OMP_NUM_THREADS=1 "$build/tests/loom_emu_tests$v" --gtest_filter="$filter" >"$log" 2>&1; then
      grep -q '^\[  PASSED  \] [1-9]' "$log" || { echo "mutation '$name': the filter ran no test"; exit 1; }
      line+=" emu$v passes;"
    elif ! grep -q '^\[==========\] .* ran\.' "$log"; then
      line+=" emu$v crashes ($(grep -m1 -E 'SUMMARY|Aborted|Segmentation|double free|corrupted' "$log" || echo "no summary"));"
    else
      failed=$(grep -m3 -E '^\[  FAILED  \] [A-Za-z]|SUMMARY: (Address|Thread)Sanitizer: [a-z-]+' "/tmp/mutation$v.log" |
               sed -E 's/^\[  FAILED  \] //; s/, where GetParam.*//; s/ \([0-9]+ ms\)//' | sort -u | paste -sd, -)
      line+=" emu$v FAILS ($failed);"
    fi
  done
  echo "$line"
done
