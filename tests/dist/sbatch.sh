#!/usr/bin/env bash
# launch/slurm/loom.sbatch as shipped, submitted with sbatch --wait to the local Slurm the tests
# start (4 tasks, as two nodes of 2 would have, on this machine): it must run (no GPUs asked of
# a cluster without them, output written where the job can write it), train every step over
# srun, and size each task's threads from the CPUs Slurm gave it.
#   sbatch.sh REPO
set -euo pipefail
repo=$1
. "$(dirname "$0")/../lib.sh"
test_dir
# A fresh clone's tree: no runs/ folder, the binary where the script expects it.
mkdir -p "$dir/launch/slurm" "$dir/build"
cp "$repo/launch/slurm/loom.sbatch" "$dir/launch/slurm/"
ln -s "$(readlink -f "$LOOM_BINARY")" "$dir/build/loom"
cat > "$dir/job.toml" <<TOML
[model]
n_layer = 2
d_model = 64
seq_len = 32
[train]
device = "cpu"
micro_batch = 2
global_batch = 8
steps = 10
[data]
val_batches = 0
[parallel]
dp = 4
TOML
cd "$dir"
job=$(sbatch --parsable --wait --ntasks-per-node=4 --cpus-per-task=1 launch/slurm/loom.sbatch job.toml) ||
  { cat loom-*.out 2>/dev/null; die "the job did not succeed"; }
out="loom-$job.out"
[ -s "$out" ] || { ls; die "no job output $out"; }
grep -E "layout|threads per rank" "$out"
steps=$(grep -c '"loss"' "runs/$job/metrics.jsonl")
[ "$steps" -eq 10 ] || { cat "$out"; die "$steps steps"; }
grep -q "1 thread per rank (SLURM_CPUS_PER_TASK)" "$out" || die "threads not from Slurm's CPUs"
grep -q "layout: 4 ranks over MPI" "$out" || die "not 4 ranks"
echo "ok: job $job, $steps steps"
