#!/usr/bin/env bash
# What checkpoints cost a run: GPT-2 124M (examples/configs/gpt2_124m.toml) for STEPS steps,
# saving every 2, with async saves, sync saves and none, alternating REPS times. Per run: the
# checkpoint blocking summed over every step (time.ckpt_block_ms), what the end of the run
# waited for the last async save, the run's summed step time, and (over the run without saves)
# how much longer its steps took: the writer's cost to the steps it runs beside.
#   examples/ckpt_cost.sh [LOOM] [REPS] [STEPS] [--set ...]
set -euo pipefail
loom=${1:-build/loom} reps=${2:-2} steps=${3:-6}
shift $(($# < 3 ? $# : 3))
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf "%-6s %4s %12s %14s %12s %12s\n" mode rep "block ms" "end wait ms" "steps ms" "vs none"
for rep in $(seq 1 "$reps"); do
  declare -A total=()
  for mode in none async sync; do
    ck=()
    case $mode in
      async) ck=(--set checkpoint.dir="$dir/ck_$mode" --set checkpoint.every=2 --set checkpoint.async=true) ;;
      sync) ck=(--set checkpoint.dir="$dir/ck_$mode" --set checkpoint.every=2 --set checkpoint.async=false) ;;
    esac
    rm -rf "$dir/ck_$mode" "$dir/log_$mode"
    "$loom" train --config examples/configs/gpt2_124m.toml --set train.steps="$steps" --set train.threads=2 \
      "${ck[@]}" --set log.dir="$dir/log_$mode" "$@" > "$dir/$mode.log" 2>&1 || { cat "$dir/$mode.log"; exit 1; }
    read -r block steps_ms < <(python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "\"time\"" in l and "\"step\"" in l]
print("%.0f %.0f" % (sum(r["time"]["ckpt_block_ms"] for r in rows), sum(r["step_ms"] for r in rows)))
' "$dir/log_$mode/metrics.jsonl")
    wait_ms=$(sed -n 's/.*the end of the run waited \([0-9]*\) ms.*/\1/p' "$dir/$mode.log")
    total[$mode]=$steps_ms
    printf "%-6s %4s %12s %14s %12s %12s\n" "$mode" "$rep" "$block" "${wait_ms:--}" "$steps_ms" \
      "$([ "$mode" = none ] && echo - || python3 -c "print('%+.0f ms' % ($steps_ms - ${total[none]}))")"
  done
done
