#!/usr/bin/env bash
# What parallel.invariant costs over shaped links (docs/invariant.md): 2 emulated nodes
# (examples/scaling/netns.sh), and for each link rate, model and layout, runs without the mode
# (A) and with it (B) alternated A B A B, after a pair of 1-step runs that warms the files and
# gives the wire bytes' start-up. Per pair: the median step_ms after --warmup steps; per row the
# runs' medians, the pairs' median ratio B / A with its range, loom's dp_comm bytes a rank sends
# a step (rank 0), the bytes a node's link carries a step (its interface's counter, TCP/IP
# included, start-up taken out), and the load average over the row's runs. The nodes come down
# however it ends. It measures, it does not judge: no threshold is applied.
#   invariant_cost.sh [--steps 20] [--warmup 3] [--pairs 4] [--links "1gbit 10gbit"]
#                     [--models "llama gpt2"] [--layouts "dp2:0 dp4:0 dp2:1 dp4:1"] [--out DIR]
#   (root; env LOOM: the binary. A layout is dpD:ZERO; dp 4 puts 2 ranks on each node.)
set -uo pipefail
cd "$(dirname "$0")/../.."
here=$PWD/examples/scaling
loom=${LOOM:-$PWD/build/loom}
steps=20 warmup=3 pairs=4 links="1gbit 10gbit" models="llama gpt2" layouts="dp2:0 dp4:0 dp2:1 dp4:1" out=""
refuse() { echo "invariant_cost: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --steps | --warmup | --pairs | --links | --models | --layouts | --out)
      [ $# -ge 2 ] || refuse "$1 needs a value"
      declare "${1#--}=$2"
      shift 2
      ;;
    *) refuse "unknown argument '$1' (see the comment at the top of $0)" ;;
  esac
done
for n in steps warmup pairs; do [[ "${!n}" =~ ^[0-9]+$ ]] || refuse "--$n ${!n}: a whole number"; done
((warmup >= 1 && steps > warmup && pairs >= 1)) || refuse "--steps $steps --warmup $warmup --pairs $pairs: need 1 <= warmup < steps and pairs >= 1"
for m in $models; do [[ "$m" =~ ^(llama|gpt2)$ ]] || refuse "--models: '$m' is not llama or gpt2"; done
for l in $layouts; do [[ "$l" =~ ^dp(2|4):[0-3]$ ]] || refuse "--layouts: '$l' is not dp2:ZERO or dp4:ZERO (ZERO 0-3)"; done
for r in $links; do [[ "$r" =~ ^[0-9]+[kmg]?bit$ ]] || refuse "--links: '$r' is not a rate like 1gbit"; done
[ "$(id -u)" -eq 0 ] || refuse "needs root (network namespaces and tc); run it as root"
[ -x "$loom" ] || refuse "LOOM=$loom is not a program (build loom first: cmake --build build --target loom)"
probe=loomcostprobe$$
ip netns add $probe 2> /dev/null || refuse "cannot make network namespaces here (ip netns add failed)"
ip netns del $probe
[ -n "$out" ] || { out=$(mktemp -d) && own_out=1; }
mkdir -p "$out" || refuse "--out $out: cannot make it"
cleanup() {
  "$here/netns.sh" down
  [ -n "${own_out:-}" ] && rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
"$here/netns.sh" up 2 "${links%% *}" > /dev/null ||
  { echo "invariant_cost: the nodes did not come up (netns.sh up 2 ${links%% *}; see its line above)" >&2; exit 1; }

# The models: small enough that the gradients' bytes weigh against the compute.
common=(--set model.n_layer=4 --set model.d_model=128 --set model.n_head=4 --set model.seq_len=64
        --set train.global_batch=8 --set train.micro_batch=2 --set train.threads=1 --set data.val_batches=0
        --set parallel.timeout_s=120)
wire() {  # bytes both nodes' links have sent
  local sum=0 i
  for i in 0 1; do sum=$((sum + $(ip netns exec loomnode$i cat /sys/class/net/eth0/statistics/tx_bytes))); done
  echo $sum
}
runs=$out/runs.tsv
: > "$runs"
run() {  # ROW MODE(plain|invariant) STEPS: one run, a line in runs.tsv
  local row=$1 mode=$2 n=$3 model dp zero dir load0 b0 b1
  IFS=/ read -r model dp zero link <<< "$row"
  dir=$out/$model.$link.dp$dp.z$zero.$mode.$n.$(wc -l < "$runs")
  load0=$(cut -d' ' -f1 /proc/loadavg)
  b0=$(wire)
  "$here/netns.sh" mpirun -np "$dp" "$loom" train "${common[@]}" --set model.arch="$model" --set parallel.dp="$dp" \
    --set parallel.zero="$zero" --set parallel.invariant=$([ "$mode" = invariant ] && echo true || echo false) \
    --set train.steps="$n" --set log.dir="$dir" > "$dir.log" 2>&1 ||
    { tail -20 "$dir.log"; echo "invariant_cost: a run failed: $row $mode (log above)" >&2; exit 1; }
  b1=$(wire)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$row" "$mode" "$n" "$dir" $((b1 - b0)) "$load0" \
    "$(cut -d' ' -f1 /proc/loadavg)" >> "$runs"
}
for link in $links; do
  "$here/netns.sh" shape "$link" 0 || { echo "invariant_cost: could not shape the links to $link" >&2; exit 1; }
  for model in $models; do
    for layout in $layouts; do
      dp=${layout%%:*}
      row=$model/${dp#dp}/${layout#*:}/$link
      echo "invariant_cost: $model, ${layout%%:*} ZeRO-${layout#*:}, $link: $pairs pairs" >&2
      run "$row" plain 1
      run "$row" invariant 1
      for ((p = 0; p < pairs; ++p)); do
        run "$row" plain "$steps"
        run "$row" invariant "$steps"
      done
    done
  done
done

python3 - "$runs" "$warmup" "$steps" << 'EOF'
import json, statistics, sys

runs_tsv, warmup, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = {}
for line in open(runs_tsv):
    if line.count("\t") != 6:
        continue
    row, mode, n, folder, wire, load0, load1 = line.rstrip("\n").split("\t")
    lines = [json.loads(l) for l in open(folder + "/metrics.jsonl") if '"step_ms"' in l]
    r = rows.setdefault(row, {"plain": [], "invariant": [], "wire1": {}, "load": []})
    r["load"] += [float(load0), float(load1)]
    if int(n) == 1:
        r["wire1"][mode] = int(wire)
        continue
    r[mode].append(dict(ms=statistics.median(x["step_ms"] for x in lines if x["step"] > warmup),
                        comm=lines[-1]["dp_comm"], wire=int(wire)))

def mb(b):
    return f"{b / 1e6:.2f}" if b >= 1e4 else f"{b:.0f} B"

def sent(c):  # what dp_comm says a rank sent: the collectives' payloads, the tree's messages
    parts = [f"{k} {mb(c[k + '_b'])}" for k in ("all_reduce", "reduce_scatter", "all_gather", "send") if c[k + "_b"]]
    return " + ".join(parts).replace("all_reduce", "AR").replace("reduce_scatter", "RS").replace("all_gather", "AG")

print("| model | layout | link | today ms | invariant ms | ratio (pairs' median) | spread (min-max) | "
      "dp_comm MB a step, rank 0: today / invariant | wire MB a step, a node: today / invariant | load |")
print("|---|---|---|---|---|---|---|---|---|---|")
for row, r in rows.items():
    if not (r["plain"] and r["invariant"] and len(r["wire1"]) == 2):
        continue  # a row cut short
    model, dp, zero, link = row.split("/")
    ratios = [b["ms"] / a["ms"] for a, b in zip(r["plain"], r["invariant"])]
    wire = {m: statistics.median(x["wire"] for x in r[m]) for m in ("plain", "invariant")}
    wire = {m: (wire[m] - r["wire1"][m]) / (steps - 1) / 2 for m in wire}  # 2 nodes
    stage = "DDP" if zero == "0" else f"ZeRO-{zero}"
    print(f"| {model} | dp {dp} ({int(dp) // 2} a node), {stage} | {link} | "
          f"{statistics.median(a['ms'] for a in r['plain']):.1f} | {statistics.median(b['ms'] for b in r['invariant']):.1f} | "
          f"{statistics.median(ratios):.3f} | {min(ratios):.3f}-{max(ratios):.3f} | "
          f"{sent(r['plain'][-1]['comm'])} / {sent(r['invariant'][-1]['comm'])} | "
          f"{mb(wire['plain'])} / {mb(wire['invariant'])} | {min(r['load']):.1f}-{max(r['load']):.1f} |")
EOF
