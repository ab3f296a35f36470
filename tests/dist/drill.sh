#!/usr/bin/env bash
# One fault drill end to end (examples/drills/drill.sh: 2 ranks, supervised, against the
# fault-free run), then what its report must say:
#   - every drill but nan (one update skipped) and bitflip_unchecked (silent by design) ends
#     with final weights bitwise equal to the fault-free run's; those two must differ;
#   - the fault is detected by the expected sign (a run's exit, a skipped update, the SDC
#     check naming rank 1, the straggler watch naming rank 1, the fallback at resume);
#   - a hang ends with the verdict naming rank 1 and the op's sequence number, within the
#     watchdog's 5 s plus 5;
#   - drill.sh itself fails if a process or an unverified checkpoint is left behind.
#   drill.sh REPO LOOM "LAUNCHER... -np" SCENARIO
set -euo pipefail
repo=$1 loom=$2 launch=$3 scenario=$4
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
LOOM=$loom LAUNCH=$launch SEED=${SEED:-11} "$repo/examples/drills/drill.sh" "$scenario" "$dir/out"
r=$dir/out/report.json
field() { python3 -c "import json,sys; v=json.load(open('$r'))['$1']; print(json.dumps(v))"; }
expect() {  # FIELD VALUE
  local got
  got=$(field "$1")
  [ "$got" = "$2" ] || { echo "FAIL: $scenario: $1 is $got, expected $2"; cat "$r"; exit 1; }
}
case $scenario in
  nan | bitflip_unchecked) expect bitwise_equal false ;;
  *) expect bitwise_equal true ;;
esac
case $scenario in
  kill | kill_in_save | exit | hang | sigterm | enospc) expect detected_by '"exit"'; expect restarts 1 ;;
  nan | nan_rollback) expect detected_by '"skip"'; expect restarts 0 ;;
  bitflip) expect detected_by '"sdc"'; expect sdc_ranks '[1]' ;;
  bitflip_unchecked) expect detected_by null ;;
  slow) expect detected_by '"straggler"'; expect stragglers '[1]' ;;
  ckpt_corrupt) expect detected_by '"fallback"' ;;
esac
case $scenario in
  kill_in_save) expect steps_lost 5 ;;  # killed writing step 15: resumed from 10
  sigterm | bitflip | slow) expect steps_lost 0 ;;
  nan) expect steps_lost 1 ;;
esac
if [ "$scenario" = hang ]; then
  step=$(python3 -c "import json; print(json.load(open('$r'))['fault']['step'])")
  grep -E "hang verdict: all_reduce #[0-9]+ on group 'dp' has waited [0-9]+ s: never reached by rank 1" \
    "$dir/out/run.log" || { echo "FAIL: no verdict naming rank 1"; grep -i verdict "$dir/out/run.log"; exit 1; }
  python3 -c "import json,sys; d=json.load(open('$r'))['detect_s']; sys.exit(0 if d < 10 else 1)" ||
    { echo "FAIL: the hang took $(field detect_s) s to end the job"; exit 1; }
  # The verdict's sequence number is the op rank 0 is waiting in, per its flight record.
  seq=$(grep -oE "hang verdict: all_reduce #[0-9]+" "$dir/out/run.log" | grep -oE "[0-9]+$")
  # (The restarted run moved the hung run's records to flight.prev.)
  python3 - "$dir/out/run/flight.prev/rank-0.json" "$seq" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["timed_out"]["seq"] == int(sys.argv[2]), d["timed_out"]
dp = [g for g in d["groups"] if g["name"] == "dp"][0]
rec = [r for r in dp["records"] if r["seq"] == int(sys.argv[2])][0]
assert rec["started"] > 0 and rec["finished"] == 0, rec
print(f"rank 0's flight record: dp #{rec['seq']} {rec['op']} started, never finished")
PY
fi
echo "ok: $scenario"
