#!/usr/bin/env bash
# The configure step builds the CUDA code for exactly the architectures it is given: a fresh
# configure with -DCMAKE_CUDA_ARCHITECTURES=90 (as tools/device_check.sh passes) must generate
# sm_90 code only, and one without it sm_80 and sm_90. Nothing is compiled.
#   cuda_architectures.sh SOURCE_DIR
set -euo pipefail
src=$1
. "$(dirname "$0")/../lib.sh"
test_dir
tmp=$dir
archs() {  # the code targets nvcc is asked for in a configured tree
  grep -oE 'arch=compute_[0-9]+,code=\[?[a-z_0-9,]+' "$1/build.ninja" | sort -u | paste -sd' ' -
}
cmake -S "$src" -B "$tmp/sm90" -G Ninja -DLOOM_CUDA=ON -DBUILD_TESTING=OFF -DCMAKE_CUDA_ARCHITECTURES=90 > "$tmp/a.log"
got=$(archs "$tmp/sm90")
[ "$got" = "arch=compute_90,code=[compute_90,sm_90" ] || die "-DCMAKE_CUDA_ARCHITECTURES=90 gives: $got"
cmake -S "$src" -B "$tmp/sm90" > "$tmp/b.log"  # a second configure keeps the choice
got=$(archs "$tmp/sm90")
[ "$got" = "arch=compute_90,code=[compute_90,sm_90" ] || die "a reconfigure changed it to: $got"
cmake -S "$src" -B "$tmp/default" -G Ninja -DLOOM_CUDA=ON -DBUILD_TESTING=OFF > "$tmp/c.log"
got=$(archs "$tmp/default")
case "$got" in
  *compute_80*compute_90*) ;;
  *) echo "FAIL: the default gives: $got"; exit 1 ;;
esac
echo "PASS: sm_90 only when asked; sm_80 and sm_90 by default"
