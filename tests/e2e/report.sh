#!/usr/bin/env bash
# loom report: two runs overlaid on one self-contained page (no scripts, nothing fetched), each
# chart with both runs' curves, the step split with the step-time model's prediction beside the
# measured bars, memory with the resident peak, both configs; headless Chromium renders it to a
# PNG (kept as report.png in REPORT_OUT when set, for a person to look at). A directory that is
# not a run is refused in one line. The prediction comes from a cluster file the runs name, so the
# page is the same on any machine; log.cluster = auto predicts only on the machine that fitted the
# shipped file, which LOOM_MACHINE_NAME stands in for both ways. The summary row is the run
# summary's; no chart title is cut; runs given one log.dir, and a directory of runs, are each drawn.
#   report.sh LOOM
set -euo pipefail
loom=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
. "$(dirname "$0")/../lib.sh"
test_dir
common=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=4 --set model.seq_len=16
        --set train.micro_batch=2 --set train.global_batch=2 --set train.threads=1 --set train.steps=30
        --set data.val_every=10 --set data.val_batches=1 --set log.cluster="$src/examples/clusters/this_machine.toml")
fitted=$(sed -n 's/^fitted_on = "\(.*\)"$/\1/p' "$src/examples/clusters/this_machine.toml")
[ -n "$fitted" ] || die "examples/clusters/this_machine.toml names no fitted_on"
short=(--set model.n_layer=1 --set model.d_model=16 --set model.n_head=2 --set model.seq_len=8 --set train.steps=2
       --set train.threads=1 --set data.val_batches=0 --verbose)
LOOM_MACHINE_NAME="$fitted" "$loom" train "${short[@]}" --set log.dir="$dir/auto_here" > "$dir/auto_here.log" 2>&1 ||
  { cat "$dir/auto_here.log"; exit 1; }
grep -q "predicted on cluster this_machine" "$dir/auto_here.log" && grep -q '"split_ms"' "$dir/auto_here/metrics.jsonl" ||
  { cat "$dir/auto_here.log"; die "log.cluster = auto did not predict on the machine that fitted it"; }
run_or_show "$dir/auto_elsewhere.log" env LOOM_MACHINE_NAME="Another CPU, 3 cores" "$loom" train "${short[@]}" \
  --set log.dir="$dir/auto_elsewhere"
grep -q "no step-time prediction: .*this_machine.toml was fitted on '$fitted', this is 'Another CPU, 3 cores'" \
  "$dir/auto_elsewhere.log" && ! grep -q '"split_ms"' "$dir/auto_elsewhere/metrics.jsonl" ||
  { cat "$dir/auto_elsewhere.log"; die "log.cluster = auto predicted on a machine the file was not fitted on"; }
for lr in 0.003 0.0005; do
  "$loom" train "${common[@]}" --set train.lr=$lr --set log.dir="$dir/lr$lr" > "$dir/lr$lr.log" 2>&1 ||
    { cat "$dir/lr$lr.log"; exit 1; }
done
"$loom" report "$dir/lr0.003" "$dir/lr0.0005" --out "$dir/report.html" | grep -q "wrote $dir/report.html (2 runs" ||
  die "loom report did not say what it wrote"
python3 - "$dir/report.html" <<'PY'
import re, sys
h = open(sys.argv[1]).read()
assert "<script" not in h and "http://" not in h.replace("http://www.w3.org/2000/svg", ""), "not self-contained"
svgs = h.count("<svg")
assert svgs == 8, f"{svgs} charts"
# Each line chart overlays both runs: 6 line charts x 2 polylines.
assert h.count("<polyline") == 12, h.count("<polyline")
for want in ["lr0.003", "lr0.0005", "(predicted)", "resident peak", "lr = 0.003", "lr = 0.0005", "train loss",
             "validation loss", "mean step split", "&quot;command&quot;"]:
    assert want in h, want
# Each chart scales to the page (the memory chart fits 1400 px), its parts each in a colour of their
# own, and the line charts' legends sit under the plot, not over the data.
assert h.count("viewBox=") == svgs and h.count("max-width:100%") == svgs, "charts that do not scale"
mem = h[h.index("memory, rank 0"):]
fills = re.findall(r"<rect x='[0-9.]+' y='[0-9.]+' width='10' height='10' fill='(#[0-9a-f]+)'", mem)
assert len(fills) == 9 and len(set(fills)) == 9, f"memory legend colours {fills}"
for y in re.findall(r"<rect x='[0-9.]+' y='([0-9.]+)' width='10' height='3'", h):
    assert float(y) > 300 - 40, f"a legend at y {y}, inside the plot"
print(f"report: {svgs} charts, {len(h) // 1000} KB")
PY
# The summary row summarises a run as its run summary does (tokens/s and MFU over the timed steps,
# which it names), not by its last step.
python3 - "$dir/report.html" "$dir/lr0.003.log" <<'PY'
import re, sys
h, log = open(sys.argv[1]).read(), open(sys.argv[2]).read()
tps, mfu = re.search(r"([0-9]+) tokens/s, MFU ([0-9.]+)%", log).groups()
row = re.search(r"<tr><td>lr0.003</td><td>30</td><td>[^<]*</td><td>[^<]*</td><td>([0-9]+)</td><td>([0-9.]+)%</td>"
                r"<td>([^<]*)</td>", h)
assert row, "no summary row for lr0.003"
assert abs(int(row[1]) - int(tps)) <= 1 and abs(float(row[2]) - float(mfu)) <= 0.1, (row.groups(), tps, mfu)
assert row[3] == "2-30", f"timed steps {row[3]}"
print(f"summary row: {row[1]} tokens/s, MFU {row[2]}% over steps {row[3]}; the run summary: {tps}, {mfu}%")
PY
# One run's page: no chart title runs past its chart's edge (13 px bold, at most 0.62 em a character).
"$loom" report "$dir/lr0.003" --out "$dir/one.html" > /dev/null
python3 - "$dir/one.html" <<'PY'
import re, sys
for w, title in re.findall(r"<svg [^>]*width='([0-9.]+)'.*?font-weight='bold'>([^<]*)</text>", open(sys.argv[1]).read()):
    need = 64 + 0.62 * 13 * len(title.replace("&amp;", "&"))
    assert need <= float(w), f"the title '{title}' needs {need:.0f} px of a {w} px chart"
print("titles fit")
PY
# A log.dir that holds another run's logs: the next run writes log.dir-2. `loom report` of their
# parent draws both, named; of the first alone, it says where the later one is.
mkdir "$dir/runs"
for n in 1 2; do
  run_or_show "$dir/x$n.log" "$loom" train "${short[@]}" --set log.dir="$dir/runs/x"
done
grep -q "metrics: $dir/runs/x-2/metrics.jsonl (log.dir '$dir/runs/x' holds another run's logs)" "$dir/x2.log" ||
  { cat "$dir/x2.log"; echo "FAIL: no log.dir-2"; exit 1; }
"$loom" report "$dir/runs" --out "$dir/runs.html" | grep -q "(2 runs" || die "a directory of runs"
grep -q "<td>x</td>" "$dir/runs.html" && grep -q "<td>x-2</td>" "$dir/runs.html" ||
  die "the runs of a directory are not named"
"$loom" report "$dir/runs/x" --out "$dir/x.html" | grep -q "not drawn: $dir/runs/x-2" ||
  die "report of x does not name x-2"
# A metrics.jsonl from before runs had a directory each, two runs from step 1 in it: two runs, named.
mkdir "$dir/old" && cat "$dir/runs/x/metrics.jsonl" "$dir/runs/x-2/metrics.jsonl" > "$dir/old/metrics.jsonl"
"$loom" report "$dir/old" --out "$dir/old.html" | grep -q "(2 runs" && grep -q "<td>old (run 2)</td>" "$dir/old.html" ||
  die "two runs in one metrics.jsonl"
# Without --out, an existing report.html is kept and the next page numbered.
mkdir "$dir/pages"
(cd "$dir/pages" && "$loom" report ../lr0.003 > first.txt && "$loom" report ../lr0.0005 > second.txt) ||
  die "loom report without --out"
grep -q "wrote report.html" "$dir/pages/first.txt" && grep -q "wrote report-2.html" "$dir/pages/second.txt" &&
  grep -q "lr0.003" "$dir/pages/report.html" && ! grep -q "lr0.0005" "$dir/pages/report.html" ||
  { cat "$dir/pages/"*.txt; die "report.html overwritten or not numbered"; }
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,1900 \
  --screenshot="$dir/report.png" "file://$dir/report.html" > "$dir/chromium.log" 2>&1 ||
  { cat "$dir/chromium.log"; exit 1; }
size=$(stat -c %s "$dir/report.png")
# A blank or unstyled page compresses to a few KB; eight charts with text do not.
[ "$size" -gt 40000 ] || die "the screenshot is $size bytes: nothing rendered?"
[ -n "${REPORT_OUT:-}" ] && cp "$dir/report.png" "$dir/report.html" "$REPORT_OUT/"
mkdir -p "$dir/empty"
out=$("$loom" report "$dir/empty" 2>&1) && die "an empty directory was reported"
[ "$(echo "$out" | wc -l)" = 1 ] && echo "$out" | grep -q "has no metrics.jsonl" ||
  die "the refusal is not one line naming the file: $out"
echo "report: ok ($size-byte screenshot)"
