#!/usr/bin/env bash
# Fault drills on 2 ranks. exit: rank 1 exits with status 3 at step 3. hang: rank 1 stops
# inside its next collective at step 3 and the watchdog (parallel.timeout_s = 5) must end the
# job, with the hang verdict naming rank 1. Either
# way the job must end within 60 s with a non-zero status and a line naming the rank (exit)
# or the stuck collective (hang), and leave no process behind.
#   fault.sh LOOM "MPIRUN..." exit|hang
set -uo pipefail
loom=$1 mpirun=$2 mode=$3
. "$(dirname "$0")/../lib.sh"
test_dir
marker="fault-drill-$$"
start=$(date +%s)
timeout 90 $mpirun -np 2 "$loom" train --set train.device=cpu --set parallel.dp=2 --set train.threads=1 --set train.steps=1000 \
  --set data.val_batches=0 --set parallel.timeout_s=5 --set log.dir="$dir/$marker" --fault-$mode 1:3 > "$dir/log" 2>&1
status=$?
elapsed=$(( $(date +%s) - start ))
grep -E "fault drill|Process name|Exit code|has not completed|hang verdict" "$dir/log" || true
echo "status $status after ${elapsed}s"
[ "$status" -ne 0 ] && [ "$status" -ne 124 ] || die "the job did not fail by itself"
[ "$elapsed" -lt 60 ] || die "took ${elapsed}s"
if [ "$mode" = exit ]; then
  grep -q "rank 1: fault drill" "$dir/log" && grep -qE "Process name: \[\[[0-9]+,[0-9]+\],1\]" "$dir/log" ||
    die "no line names rank 1"
else
  grep -qE "error: rank 0: all_reduce #[0-9]+ on group 'dp' has not completed" "$dir/log" ||
    die "the watchdog did not name the stuck collective"
  grep -qE "hang verdict: all_reduce #[0-9]+ on group 'dp' has waited [0-9]+ s: never reached by rank 1" "$dir/log" ||
    die "no hang verdict naming rank 1"
fi
no_processes_left "$marker"
echo "ok"
