#!/usr/bin/env bash
# log.grad_norms and loom_compare_runs --grad-norms: every tensor's step-1 gradient norm of an
# fp32 and a bf16 run of one model agree within the bf16 tolerance, and the compare fails
# when one tensor's gradient is zero or off by 10% (what a weight tolerance after a few Adam
# steps lets through); a multi-rank layout is refused.
#   grad_norms.sh LOOM COMPARE
set -uo pipefail
loom=$1 compare=$2
. "$(dirname "$0")/../lib.sh"
test_dir
common=(--set model.n_layer=2 --set model.d_model=64 --set model.n_head=2 --set train.steps=2 --set train.threads=1
        --set train.device=cpu --set data.val_batches=0 --set log.grad_norms=true)
run_or_show "$dir/f32.log" "$loom" train "${common[@]}" --set log.dir="$dir/f32"
"$loom" train "${common[@]}" --set train.dtype=bf16 --set log.dir="$dir/bf16" > "$dir/bf16.log" 2>&1 ||
  { cat "$dir/bf16.log"; exit 1; }
"$compare" --grad-norms "$dir/bf16" "$dir/f32" 2e-2 || die "bf16 against fp32"
for change in zero tenth; do
  mkdir -p "$dir/$change"
  python3 - "$dir/bf16/grad_norms.json" "$dir/$change/grad_norms.json" "$change" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))
name = sorted(k for k in g if k.endswith("mlp.c_fc.weight"))[0]
g[name] = 0.0 if sys.argv[3] == "zero" else g[name] * 1.1
json.dump(g, open(sys.argv[2], "w"))
PY
  if "$compare" --grad-norms "$dir/$change" "$dir/f32" 2e-2; then echo "FAIL: a tensor's gradient ($change) passed"; exit 1; fi
done
if "$loom" train "${common[@]}" --set parallel.dp=2 --set log.dir="$dir/dp2" > "$dir/dp2.log" 2>&1; then
  echo "FAIL: log.grad_norms accepted at dp 2"
  exit 1
fi
grep -q "log.grad_norms writes the whole model's gradients from one rank" "$dir/dp2.log" || { cat "$dir/dp2.log"; exit 1; }
echo ok
