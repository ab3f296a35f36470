#!/usr/bin/env bash
# A dataset larger than this machine's memory (8 shards of 4 GB, sparse: no disk) trains at
# 2 ranks with the resident peak of a run on a 1 MB dataset, within 8 MB, and opens in about
# the small run's time (both printed; a run that read its data whole would take minutes or
# run out of memory).
#   big_data.sh LOOM "MPIRUN... -np"
set -euo pipefail
loom=$1 launch=$2
. "$(dirname "$0")/../lib.sh"
test_dir
mkdir "$dir/big" "$dir/small"
python3 - "$dir" <<'PY'
import os, struct, sys
d = sys.argv[1]
def shard(path, n, body=None):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        if body is not None:
            f.write(body)
        else:
            f.truncate(1024 + 2 * n)  # sparse: reads as token 0
tokens = 2_000_000_000
for i in range(8):
    shard("%s/big/shard_%02d.bin" % (d, i), tokens)
pattern = bytes(struct.pack("<8H", *range(8))) * (1 << 16)
shard(d + "/small/shard_00.bin", len(pattern) // 2, pattern)
PY
du -sh --apparent-size "$dir/big" "$dir/small"
run() {  # NAME
  local start=$SECONDS
  run_or_show "$dir/$1.log" ranks 2 "$loom" train --set data.source=tokens \
    --set data.path="$dir/$1" --set parallel.dp=2 \
    --set train.steps=3 --set train.threads=1 --set data.shuffle=true --set data.val_batches=1 \
    --set log.dir="$dir/log_$1"
  echo "$1: $((SECONDS - start)) s for 3 steps; $(grep -o "data: .*tokens" "$dir/$1.log" | head -1)"
}
run small
run big
peak() { python3 -c "import json,sys; print(max(json.loads(l).get('mem',{}).get('rss_peak_b',0) for l in open(sys.argv[1]) if l.startswith('{\"step\"')))" "$1"; }
small=$(peak "$dir/log_small/metrics.jsonl") big=$(peak "$dir/log_big/metrics.jsonl")
echo "resident peak, rank 0: $((small / 1048576)) MB on 1 MB of data, $((big / 1048576)) MB on 32 GB"
d=$((big - small))
[ "${d#-}" -lt $((8 << 20)) ]
