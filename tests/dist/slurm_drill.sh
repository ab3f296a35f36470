#!/usr/bin/env bash
# The kill drill inside a Slurm allocation of 2 tasks: `loom supervise` restarts the srun step
# in the same allocation, and the final weights equal the fault-free run's (tests/dist/drill.sh).
#   slurm_drill.sh REPO LOOM
set -uo pipefail
repo=$1 loom=$2
. "$(dirname "$0")/../lib.sh"
test_dir
sbatch --wait --quiet -n 2 --cpus-per-task=1 -o "$dir/job.out" \
  --wrap="$repo/tests/dist/drill.sh $repo $loom 'srun --mpi=pmix --kill-on-bad-exit=1 -n' kill"
rc=$?
cat "$dir/job.out"
[ "$rc" -eq 0 ] && grep -q "ok: kill" "$dir/job.out" || die "the job ended with status $rc"
