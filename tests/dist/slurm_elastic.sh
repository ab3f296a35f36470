#!/usr/bin/env bash
# loom supervise --ranks inside a Slurm allocation (the local Slurm the tests start): the hosts
# come from the allocation (scontrol), each probed with an srun task, and the job runs over
# srun with the layout the supervisor fills in ({ranks}, {dp}).
#   slurm_elastic.sh LOOM
set -euo pipefail
loom=$(readlink -f "$1")
. "$(dirname "$0")/../lib.sh"
test_dir
cat > "$dir/job.sh" <<SH
#!/usr/bin/env bash
"$loom" supervise --ranks 2:4 --max-restarts 0 --log-dir "$dir/run" -- srun --mpi=pmix -n {ranks} "$loom" train \\
  --set model.n_layer=1 --set model.d_model=32 --set model.seq_len=16 --set train.device=cpu \\
  --set train.micro_batch=1 --set train.global_batch=8 --set train.steps=4 --set data.val_batches=0 \\
  --set parallel.dp={dp} --set log.dir="$dir/run"
SH
chmod +x "$dir/job.sh"
sbatch --parsable --wait --ntasks-per-node=4 --cpus-per-task=1 -o "$dir/out.txt" "$dir/job.sh" > /dev/null ||
  { cat "$dir/out.txt"; die "the job did not succeed"; }
cat "$dir/out.txt" | grep supervise
node=$(grep -o '"hosts":"[^"]*"' "$dir/run/faults.jsonl" | head -1)
grep -qE '"event":"layout","t":[0-9.]+,"restart":0,"ranks":4,"dp":4,"hosts":"[^":,]+:4","lost":0' "$dir/run/faults.jsonl" ||
  { echo "FAIL: not 4 ranks on the allocation's node: $(cat "$dir/run/faults.jsonl")"; exit 1; }
[ "$(grep -c '"loss"' "$dir/run/metrics.jsonl")" -eq 4 ] || die "the job did not train"
grep -q "layout: 4 ranks over MPI" "$dir/out.txt" || { cat "$dir/out.txt"; die "not 4 ranks"; }
echo "ok: $node"
