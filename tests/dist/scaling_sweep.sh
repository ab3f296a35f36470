#!/usr/bin/env bash
# examples/scaling/sweep.py end to end on a tiny model: a strong dp sweep (1, 2 ranks) and a
# weak one, their CSVs checked: one row per point with the layout and ranks asked for, the
# weak points' global batch grown with the ranks (in the CSV and in the tokens the run counted),
# every time of the split non-negative and together no more than the step, and the efficiency
# the throughput ratio over the rank ratio.
#   scaling_sweep.sh SOURCE_DIR LOOM "MPIRUN... -np"
set -euo pipefail
src=$1 loom=$2 launch=$3
. "$(dirname "$0")/../lib.sh"
test_dir
sets=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=4 --set model.vocab_size=96
      --set model.seq_len=16 --set train.micro_batch=2 --set train.global_batch=4 --set train.steps=5
      --set train.threads=1 --set train.device=cpu --set data.val_batches=0)
for mode in strong weak; do
  run_or_show "$dir/$mode.log" python3 "$src/examples/scaling/sweep.py" --loom "$loom" --launch "$launch" \
    "${sets[@]}" --sweep parallel.dp=1,2 \
    --"$mode" --out "$dir/$mode.csv"
done
python3 - "$dir/strong.csv" "$dir/weak.csv" <<'PY'
import csv, sys
split = ["compute_ms", "comm_exposed_ms", "bubble_ms", "optimizer_ms", "data_ms", "ckpt_block_ms", "other_ms"]
for path, mode in zip(sys.argv[1:], ["strong", "weak"]):
    rows = list(csv.DictReader(open(path)))
    assert [r["layout"] for r in rows] == ["dp1 tp1 pp1 zero0", "dp2 tp1 pp1 zero0"], rows
    assert [int(r["ranks"]) for r in rows] == [1, 2]
    assert all(r["mode"] == mode for r in rows)
    assert float(rows[0]["efficiency"]) == 1.0
    gb = [int(r["global_batch"]) for r in rows]
    assert gb == ([4, 4] if mode == "strong" else [4, 8]), gb
    for r in rows:
        parts = [float(r[k]) for k in split]
        assert min(parts) >= 0 and sum(parts) <= float(r["step_ms"]) * 1.001, r
    ratio = float(rows[1]["tokens_per_s"]) / float(rows[0]["tokens_per_s"]) / 2
    assert abs(float(rows[1]["efficiency"]) - ratio) <= 3e-3 * ratio, (rows[1]["efficiency"], ratio)  # 4 digits each
print("ok")
PY
# The global batch reached the runs: the tokens each one counted (5 steps of 16 tokens per sequence).
for point in strong_runs/dp2_strong:320 weak_runs/dp2_weak:640; do
  tokens=$(grep -o '"tokens":[0-9]*' "$dir/${point%%:*}/metrics.jsonl" | tail -1 | cut -d: -f2)
  [ "$tokens" = "${point##*:}" ] || die "${point%%:*} counted $tokens tokens, not ${point##*:}"
done
# The step-time model's harness on the same points: calibrate fits a cluster file to a run of
# the model (its compute must come back exactly: the fit solves for it) and bench comm at 2
# ranks; validate predicts every point of both sweeps with it.
# Its --out in a folder not made yet: calibrate makes it (it ended in a traceback after the work).
# Its scratch folder (the training run's logs) is gone after it (TMPDIR the test's own).
mkdir "$dir/tmp"
( TMPDIR=$dir/tmp python3 "$src/examples/scaling/calibrate.py" --loom "$loom" --launch "$launch" "${sets[@]}" \
    --ranks 2 --max-mb 1 --out "$dir/new/fit.toml" > "$dir/calibrate.log" 2>&1 ) || { cat "$dir/calibrate.log"; exit 1; }
! compgen -G "$dir/tmp/calibrate_*" > /dev/null || { ls "$dir/tmp"; echo "FAIL: calibrate left its scratch"; exit 1; }
mv "$dir/new/"* "$dir/"
[ -s "$dir/fit.intra2.txt" ] || die "calibrate kept no bench comm record"
run_or_show "$dir/validate.log" python3 "$src/examples/scaling/validate.py" --loom "$loom" \
  "${sets[@]}" --cluster "$dir/fit.toml" "$dir/strong.csv" \
  "$dir/weak.csv" --out "$dir/check.csv"
python3 - "$dir/fit.toml" "$dir/check.csv" "$loom" "${sets[@]}" <<'PY'
import csv, json, re, subprocess, sys
fit, check, loom, sets = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
text = open(fit).read()
measured = float(re.search(r"compute ([0-9.]+) ms", text).group(1))
for key in ("peak_tflops", "gemm_efficiency", "mem_bw_gbs", "[intra]", "all_reduce_gbs"):
    assert key in text, (key, text)
out = subprocess.run([loom, "plan", "layout", "--cluster", fit, "--predict", "--json"] + sets, check=True,
                     stdout=subprocess.PIPE, text=True).stdout
predicted = json.loads(out.strip().splitlines()[-1])["compute_ms"]
assert abs(predicted / measured - 1) < 2e-3, (predicted, measured)  # the comment keeps 4 digits
rows = list(csv.DictReader(open(check)))
assert [r["layout"] for r in rows] == ["dp1 tp1 pp1 zero0", "dp2 tp1 pp1 zero0"] * 2, rows
for r in rows:
    assert float(r["predicted_ms"]) > 0 and float(r["measured_ms"]) > 0, r
    # Each of the three is written with 4 digits: the ratio's rounding grows with the ratio.
    ratio = float(r["predicted_ms"]) / float(r["measured_ms"])
    assert abs(ratio - 1 - float(r["error"])) < 1.2e-3 * max(1.0, ratio), r
print("ok: model harness")
PY
