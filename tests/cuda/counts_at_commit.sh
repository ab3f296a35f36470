#!/usr/bin/env bash
# The counts of an earlier commit's kernels, by today's counting emulation: that commit's
# kernels/cuda/ (and the headers they include) from git, today's kernels/emu/ and count driver
# over them, built with g++ into a scratch folder and run; CSV on stdout (kernels/emu/count_csv.cpp).
# For the counts of the kernels the H200 timed, which the time model is to be checked against:
#   tests/cuda/counts_at_commit.sh 8150dfa --with-llama-attention > counts_8150dfa.csv
# (arguments after the commit go to the counting program, tests/cuda/counts_csv.cpp).
# The commit's wrappers must have today's signatures for the ops count_ops.cpp calls (8150dfa's do).
# Not part of ctest (a few minutes of compiling).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
commit="${1:?usage: counts_at_commit.sh COMMIT [--with-llama-attention]}"
shift
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src" "$tmp/obj"
git -C "$root" archive "$commit" | tar -x -C "$tmp/src"
rm -rf "$tmp/src/kernels/emu"
cp -r "$root/kernels/emu" "$tmp/src/kernels/emu"
# Today's emulation words its messages with today's error helpers (plural(), ...).
cp "$root/runtime/error.h" "$tmp/src/runtime/"
cp "$root/tests/cuda/counts_csv.cpp" "$tmp/src/counts_csv.cpp"
# Include roots as the layers have them: the tree itself.
flags=(-std=gnu++20 -O3 -march=native -DNDEBUG -DLOOM_CUDA_EMULATION -DLOOM_HAVE_CUDA=1 -DLOOM_HAVE_MPI=0
       -DLOOM_VERSION=\"count\" -DLOOM_BUILD_TYPE=\"Release\" -I "$tmp/src/kernels/emu/include" -I "$tmp/src"
       -Wno-unknown-pragmas -w)
count=(-DLOOM_EMU_COUNT -Dcuda=cuda_count)
objs=()
compile() {  # compile OUT SOURCE FLAGS...
  local out="$tmp/obj/$1" src="$2"
  shift 2
  g++ "${flags[@]}" "$@" -c "$src" -o "$out" && objs+=("$out")
}
# Earlier commits kept the reference attention kernels at kernels/cuda/attention{,_tc}.cu.
for k in attention attention_block attention_flash attention_flash_bwd attention_flash_ds attention_tc elementwise loss_optim norm reference/attention_rowwise \
  reference/attention_wmma; do
  [ -f "$tmp/src/kernels/cuda/$k.cu" ] || continue
  o=${k//\//_}
  echo "#include \"kernels/cuda/$k.cu\"" > "$tmp/src/$o.count.cpp"
  # the fixed target of the CMake build's counting kernels (CMakeLists.txt), after -march=native
  compile "$o.o" "$tmp/src/$o.count.cpp" "${count[@]}" -fsanitize=thread --param=tsan-instrument-func-entry-exit=0 \
    -march=x86-64-v2 -mtune=generic &
done
wait
objs=("$tmp"/obj/*.o)
for f in count_hooks count_ops count_csv; do compile "$f.o" "$tmp/src/kernels/emu/$f.cpp" "${count[@]}"; done
for f in block fiber counts runtime stream; do compile "emu_$f.o" "$tmp/src/kernels/emu/$f.cpp"; done
compile main.o "$tmp/src/counts_csv.cpp"
# What the kernels' host code calls from the runtime layer (errors, checks).
for f in $(cd "$tmp/src" && ls runtime/error.cpp runtime/cuda_check.cpp 2> /dev/null); do
  compile "rt_$(basename "$f" .cpp).o" "$tmp/src/$f" "${count[@]}"
done
g++ "${objs[@]}" -o "$tmp/counts" -lfmt -lspdlog -lpthread
"$tmp/counts" "$@"
