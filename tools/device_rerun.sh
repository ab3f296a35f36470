#!/usr/bin/env bash
# Reruns only the stages of tools/device_check.sh that failed or ran out of time last time,
# as $OUT/stages.txt lists them (the build too, if it is one of them; later stages need it).
#   device_rerun.sh [--dry-run]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}
[ -f "$out/stages.txt" ] || { echo "no $out/stages.txt: run tools/device_check.sh first" >&2; exit 2; }
again=$(grep -vE ": (ok|stubbed)," "$out/stages.txt" | cut -d: -f1 | paste -sd,)
if [ -z "$again" ]; then
  echo "every stage passed last time: nothing to rerun"
  exit 0
fi
echo "rerunning: $again"
# probe sets up mpirun's flags and the PyTorch the later stages use: it always runs.
exec tools/device_check.sh --only "probe,$again" "$@"
