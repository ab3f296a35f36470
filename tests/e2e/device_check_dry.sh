#!/usr/bin/env bash
# tools/device_check.sh without a GPU (--dry-run: the stages that need one are stubbed, each
# taking DRY_STAGE_S): under a 40 s deadline (20 s for stages, 20 s kept for packing) with 4 s
# stubs the last stages must be cut or not started, the script must end by the deadline with
# a non-zero status, and after every stage the summary, the stage list and the log tarball
# must be there; then tools/device_rerun.sh must rerun only what failed, and pass.
#   device_check_dry.sh REPO BUILD_DIR
set -uo pipefail
repo=$1 build=$2
. "$(dirname "$0")/../lib.sh"
test_dir
export OUT=$dir/out WORK=$dir/work SKIP_BUILD=1 BUILD_DIR=$build
start=$(date +%s)
DEADLINE_S=40 DRY_STAGE_S=4 "$repo/tools/device_check.sh" --dry-run \
  --only probe,build,kernels,parity,ckpt_drills,layouts,bench,sanitizers > "$dir/first.log" 2>&1
status=$?
elapsed=$(( $(date +%s) - start ))
cat "$OUT/stages.txt"
echo "status $status after ${elapsed}s"
fail() { cat "$dir/first.log"; die "$*"; }
[ "$status" -ne 0 ] || fail "a run cut by its deadline exited 0"
[ "$elapsed" -le 45 ] || fail "took ${elapsed}s past a 40 s deadline"
grep -q "^probe: ok" "$OUT/stages.txt" || fail "the probe did not pass"
grep -q "^kernels: stubbed" "$OUT/stages.txt" || fail "kernels were not stubbed"
grep -qE "^(layouts|bench|sanitizers): (stubbed \(deadline\)|deadline \(not started\))" "$OUT/stages.txt" ||
  fail "no stage was cut by the deadline"
grep -q "^sanitizers: deadline (not started)" "$OUT/stages.txt" || fail "the last stage started past the deadline"
grep -q "dry run" "$OUT/summary.txt" && grep -q "sanitizers: deadline" "$OUT/summary.txt" ||
  fail "the summary was not rewritten after the last stage"
listing=$(tar tzf "$OUT/logs.tar.gz")  # not piped into grep -q: under pipefail tar's SIGPIPE would fail it
grep -q probe.txt <<< "$listing" || fail "the tarball lacks the probe's log"
[ "$(ls "$OUT" | wc -l)" -le 8 ] || fail "more than 8 files in \$OUT: $(ls "$OUT")"
DRY_STAGE_S=0 "$repo/tools/device_rerun.sh" --dry-run > "$dir/rerun.log" 2>&1 || { cat "$dir/rerun.log"; fail "the rerun failed"; }
cat "$OUT/stages.txt"
grep -q "^kernels" "$OUT/stages.txt" && fail "the rerun ran a stage that had passed"
grep -q "^sanitizers: stubbed" "$OUT/stages.txt" || fail "the rerun did not run the stages that were cut"
echo ok
