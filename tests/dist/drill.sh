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
. "$(dirname "$0")/../lib.sh"
test_dir
LOOM=$loom LAUNCH=$launch SEED=${SEED:-11} "$repo/examples/drills/drill.sh" "$scenario" "$dir/out" | tee "$dir/table"
r=$dir/out/report.json
# The drill prints a table a reader can read: its header, then the row.
head -1 "$dir/table" | grep -q "^| drill | fault | detect | recover |" && tail -1 "$dir/table" | grep -q "^| $scenario |" ||
  { cat "$dir/table"; die "the drill's table has no header"; }
field() { python3 -c "import json,sys; v=json.load(open('$r'))['$1']; print(json.dumps(v))"; }
expect() {  # FIELD VALUE
  local got
  got=$(field "$1")
  [ "$got" = "$2" ] || { cat "$r"; die "$scenario: $1 is $got, expected $2"; }
}
case $scenario in
  nan | bitflip_unchecked) expect bitwise_equal false ;;
  *) expect bitwise_equal true ;;
esac
case $scenario in
  kill | kill_in_save | exit | hang | sigterm | preempt | enospc) expect detected_by '"exit"'; expect restarts 1 ;;
  nan | nan_rollback) expect detected_by '"skip"'; expect restarts 0 ;;
  bitflip) expect detected_by '"sdc"'; expect sdc_ranks '[1]' ;;
  bitflip_unchecked) expect detected_by null ;;
  slow) expect detected_by '"straggler"'; expect stragglers '[1]' ;;
  ckpt_corrupt) expect detected_by '"fallback"' ;;
esac
case $scenario in
  kill_in_save) expect steps_lost 5 ;;  # killed writing step 15: resumed from 10
  sigterm | preempt | bitflip | slow) expect steps_lost 0 ;;
  nan) expect steps_lost 1 ;;
esac
if [ "$scenario" = hang ]; then
  step=$(python3 -c "import json; print(json.load(open('$r'))['fault']['step'])")
  grep -E "hang verdict: all_reduce #[0-9]+ on group '(dp|tp)' has waited [0-9]+ s: never reached by rank 1|no record from rank 1 " \
    "$dir/out/run.log" || { grep -i verdict "$dir/out/run.log"; die "no verdict naming rank 1"; }
  python3 -c "import json,sys; d=json.load(open('$r'))['detect_s']; sys.exit(0 if d < 10 else 1)" ||
    die "the hang took $(field detect_s) s to end the job"
  # The verdict's sequence number is the op rank 0 is waiting in, per its flight record.
  # The verdict's op is one that a rank's watchdog timed out on, per that rank's flight record
  # (the restarted run moved the hung run's records to flight.prev).
  read -r group seq < <(grep -oE "hang verdict: all_reduce #[0-9]+ on group '[a-z]+'" "$dir/out/run.log" |
    sed -E "s/.*#([0-9]+) on group '([a-z]+)'/\2 \1/")
  python3 - "$dir/out/run/flight.prev" "$group" "$seq" <<'PY'
import glob, json, sys
flight, group, seq = sys.argv[1], sys.argv[2], int(sys.argv[3])
for path in sorted(glob.glob(flight + "/rank-*.json")):
    d = json.load(open(path))
    t = d.get("timed_out")
    if t and t["group"] == group and t["seq"] == seq:
        g = [g for g in d["groups"] if g["name"] == group and g.get("backend") == t.get("backend")][0]
        rec = [r for r in g["records"] if r["seq"] == seq][0]
        assert rec["started"] > 0 and rec["finished"] == 0, rec
        assert not any(json.load(open(p))["rank"] == 1 for p in glob.glob(flight + "/rank-*.json")), "rank 1 wrote"
        print(f"rank {d['rank']}'s flight record: {group} #{seq} {rec['op']} started, never finished")
        break
else:
    sys.exit(f"no flight record timed out on {group} #{seq}")
PY
fi
echo "ok: $scenario"
