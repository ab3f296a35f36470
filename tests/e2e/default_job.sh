#!/usr/bin/env bash
# The default training job (no config) must finish and reach the validation loss the README
# promises: below 1.70 nats on the synthetic corpus (unigram entropy 5.97, entropy rate 1.51).
set -euo pipefail
loom=$1
. "$(dirname "$0")/../lib.sh"
test_dir
"$loom" train --set log.dir="$dir" --set log.every=100
val=$(grep -o '"val_loss":[0-9.e+-]*' "$dir/metrics.jsonl" | tail -1 | cut -d: -f2)
steps=$(grep -c '"loss"' "$dir/metrics.jsonl")
echo "default job: $steps steps, final val_loss $val (threshold 1.70)"
[ "$steps" -eq 400 ]
awk -v v="$val" 'BEGIN { exit !(v < 1.70) }'
