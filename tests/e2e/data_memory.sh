#!/usr/bin/env bash
# loom data streams a long document: one line of text (no line break at all) of 16 MB and of
# 128 MB makes its shard with the same resident peak, within 16 MB (a 1 GB line reached 15.7 GB
# resident: 15x its input, read and held whole with its tokens; 1939 MB on the 128 MB line).
# Both peaks are printed; the shard holds one token per byte, in order. Under AddressSanitizer
# its quarantine of freed memory is turned off for the measured runs (it would count as
# resident what the allocator was given back).
#   data_memory.sh LOOM
set -euo pipefail
loom=$1
. "$(dirname "$0")/../lib.sh"
test_dir
python3 - "$dir" <<'PY'
import sys
words = b"alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu "
for mb in (16, 128):
    with open(f"{sys.argv[1]}/line{mb}.txt", "wb") as f:
        f.write(words * (mb * 2**20 // len(words)))
PY
peak() {  # FILE: the resident peak of `loom data FILE`, in bytes
  python3 - "$loom" "$1" "$dir/out.bin" <<'PY'
import os, resource, subprocess, sys
env = dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=0")
subprocess.run([sys.argv[1], "data", sys.argv[2], sys.argv[3]], check=True, stdout=subprocess.DEVNULL, env=env)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
PY
}
small=$(peak "$dir/line16.txt")
big=$(peak "$dir/line128.txt")
echo "resident peak of loom data: $((small >> 20)) MB on a 16 MB line, $((big >> 20)) MB on a 128 MB line"
python3 - "$dir/out.bin" "$dir/line128.txt" <<'PY'
import struct, sys
shard, text = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
magic, version, n = struct.unpack("<3i", shard[:12])
assert (magic, n) == (20240520, len(text)), (magic, n, len(text))
assert shard[1024:1024 + 2 * 4096:2] == text[:4096] and shard[-2::-2][:4096] == text[::-1][:4096], "not the text"
PY
[ $((big - small)) -lt $((16 << 20)) ] || die "the peak grew with the input"
echo "data memory: bounded"
