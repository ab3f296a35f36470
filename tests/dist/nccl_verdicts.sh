#!/usr/bin/env bash
# Programs that break NCCL's rules (test_nccl_emulated.cpp's scenarios), on 4 ranks: over MPI's
# groups each finishes; over parallel.comm = "nccl-emulated" each must end within 30 s with a
# verdict that names the ranks, the groups and the ops that wait on each other.
#   nccl_verdicts.sh BINARY "MPIRUN..."
set -uo pipefail
bin=$1 mpirun=$2
. "$(dirname "$0")/../lib.sh"
test_dir
fail=0
check() {  # scenario, then the regexes its verdict must match
  local name=$1
  shift
  timeout 60 $mpirun -np 4 "$bin" --scenario "$name" --mpi > "$dir/$name.mpi" 2>&1
  local status=$?
  if [ "$status" -ne 0 ] || [ "$(grep -c "scenario $name finished" "$dir/$name.mpi")" -ne 4 ]; then
    echo "FAIL: $name over MPI (the control) did not finish (status $status)"
    cat "$dir/$name.mpi"
    fail=1
  fi
  local start=$(date +%s)
  timeout 60 $mpirun -np 4 "$bin" --scenario "$name" > "$dir/$name.log" 2>&1
  status=$?
  local elapsed=$(( $(date +%s) - start ))
  grep "deadlock under" "$dir/$name.log" | head -1
  echo "$name: status $status after ${elapsed}s"
  if [ "$status" -eq 0 ] || [ "$status" -eq 124 ] || [ "$elapsed" -ge 30 ]; then
    echo "FAIL: $name was not ended by a verdict"
    cat "$dir/$name.log"
    fail=1
    return
  fi
  for re in "$@"; do
    grep -qE "$re" "$dir/$name.log" || { echo "FAIL: $name: no line matches: $re"; fail=1; }
  done
}
check recv_first "deadlock under NCCL's rules .*: ranks (0, 2|1, 3) wait on each other" \
  "rank [0-3] waits in recv from rank [0-3] \(#1\) on group 'dp' for rank [0-3] \(at recv from rank [0-3]"
check dp_tp_order "deadlock under NCCL's rules .*: ranks 0, 1, 2, 3 wait on each other" \
  "rank 0 waits in all_reduce #1 on group 'dp' for rank 2 \(at all_reduce #1 on group 'tp'\)" \
  "rank 1 waits in all_reduce #1 on group 'tp' for rank 0 \(at all_reduce #1 on group 'dp'\)"
exit $fail
