#!/usr/bin/env bash
# The pipeline bubble measured against its prediction, for each schedule at p = 2 (two ranks,
# one thread each): the mean over steps 3.. of bubble_ms / step_ms (bubble_ms: the waiting of
# the stage that waits most), next to `loom plan pipeline`'s prediction. Prints a Markdown table.
#   examples/pipeline/bubble.sh [SCHEDULE:MICRO ...]   (default: each schedule at m 4 and 8;
#   interleaved with two model chunks per stage, two blocks each; zbv and dualpipev in a V)
#   env: LOOM (build/loom), LAUNCH ("launch/mpirun.sh -np"), STEPS (20), ARGS (extra --set ...)
set -euo pipefail
cd "$(dirname "$0")/../.."
loom=${LOOM:-build/loom} launch=${LAUNCH:-launch/mpirun.sh -np} steps=${STEPS:-20}
points=("$@")
[ ${#points[@]} -gt 0 ] ||
  points=(gpipe:4 1f1b:4 interleaved:4 zb:4 zbv:4 dualpipev:4 gpipe:8 1f1b:8 interleaved:8 zb:8 zbv:8 dualpipev:8)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# Two equal stages: a small vocabulary keeps the head from outweighing the blocks.
model=(--set model.n_layer=8 --set model.d_model=256 --set model.n_head=8 --set model.seq_len=128 --set model.vocab_size=512
       --set train.micro_batch=2 --set train.threads=1 --set data.val_batches=0 --set parallel.pp=2)
echo "| schedule | m | predicted | measured |"
echo "| --- | ---: | ---: | ---: |"
for point in "${points[@]}"; do
  s=${point%%:*} m=${point##*:}
  v=()
  [ "$s" = interleaved ] && v=(--set parallel.pp_virtual=2)  # zbv and dualpipev take their V's 2 themselves
  set -- --set train.global_batch=$((2 * m)) --set parallel.pp_schedule="$s" "${v[@]}"
  # shellcheck disable=SC2086
  $launch 2 "$loom" train "${model[@]}" "$@" --set train.steps="$steps" ${ARGS:-} --set log.dir="$dir/$s$m" \
    > "$dir/$s$m.log" 2>&1 || { cat "$dir/$s$m.log"; exit 1; }
  predicted=$(grep -o "predicted bubble [0-9.]*" "$dir/$s$m.log" | awk '{print $3}')
  measured=$(python3 - "$dir/$s$m/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"bubble_ms"' in l]
rows = [r for r in rows if r["step"] >= 3]
print(f"{sum(r['time']['bubble_ms'] / r['step_ms'] for r in rows) / len(rows):.3f}")
PY
)
  echo "| $s | $m | $predicted | $measured |"
done
