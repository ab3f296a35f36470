#!/usr/bin/env bash
# log.tensorboard: the event files, read by tensorboard_read.py (its own TFRecord and protobuf
# decoding, both CRCs checked), hold every step's loss, lr and grad norm as metrics.jsonl has
# them (float32), the step split, memory, validation, and per-layer MoE load and dropped
# fraction; a damaged byte is caught by the reader.
#   tensorboard.sh LOOM READER
set -euo pipefail
loom=$1 reader=$2
. "$(dirname "$0")/../lib.sh"
test_dir
common=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=4 --set model.seq_len=16
        --set train.micro_batch=2 --set train.global_batch=2 --set train.threads=1 --set train.steps=6
        --set data.val_every=3 --set data.val_batches=1 --set log.tensorboard=true --set log.cluster=none)
run_or_show "$dir/dense.log" "$loom" train "${common[@]}" --set log.dir="$dir/dense"
run_or_show "$dir/moe.log" "$loom" train "${common[@]}" --set model.arch=llama \
  --set model.moe.num_experts=4 --set model.moe.capacity_factor=1 \
  --set log.dir="$dir/moe"
grep -q "TensorBoard: tensorboard --logdir $dir/dense" "$dir/dense.log" || die "the log does not say"
for run in dense moe; do
  python3 "$reader" "$dir/$run" > "$dir/$run.json" || die "$run: the reader refused the file"
  python3 - "$dir/$run.json" "$dir/$run/metrics.jsonl" "$run" <<'PY'
import json, struct, sys
tb = json.load(open(sys.argv[1]))
steps = [json.loads(l) for l in open(sys.argv[2]) if '"loss"' in l]
vals = [json.loads(l) for l in open(sys.argv[2]) if '"val_loss"' in l]
s = tb["scalars"]
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
assert tb["file_version"] == "brain.Event:2", tb["file_version"]
assert tb["wall_time_increases"]
for tag, key in [("train/loss", "loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm")]:
    got = s[tag]
    want = [[m["step"], f32(m[key])] for m in steps]
    assert got == want, f"{tag}: {got} != {want}"
assert [x[0] for x in s["val/loss"]] == [v["step"] for v in vals] == [3, 6], s["val/loss"]
assert [x[1] for x in s["val/loss"]] == [f32(v["val_loss"]) for v in vals]
for tag in ["train/tokens_per_s", "train/mfu", "train/skipped", "time/compute_ms", "time/optimizer_ms",
            "mem/peak_mib", "mem/params_mib", "mem/activations_mib"]:
    assert len(s[tag]) == 6, (tag, s.get(tag))
assert s["mem/peak_mib"][0][1] > 0
if sys.argv[3] == "moe":
    layers = sorted(t for t in s if t.startswith("moe/layer"))
    assert layers == ["moe/layer0/dropped", "moe/layer0/load", "moe/layer1/dropped", "moe/layer1/load"], layers
    assert [x[1] for x in s["moe/layer0/load"]] == [f32(m["moe"][0]["load"]) for m in steps]
    assert len(s["moe/aux_loss"]) == 6
else:
    assert not any(t.startswith("moe/") for t in s)
print(f"{sys.argv[3]}: {len(s)} tags over {len(steps)} steps, equal to metrics.jsonl")
PY
done
# The reader has teeth: one damaged byte in a record's body fails its CRC.
f=$(ls "$dir"/dense/events.out.tfevents.*)
python3 -c "
import sys
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[len(b) // 2] ^= 0x40; open(p, 'wb').write(b)" "$f"
if python3 "$reader" "$dir/dense" > /dev/null 2> "$dir/bad.txt"; then echo "FAIL: a damaged file was read"; exit 1; fi
grep -q "CRC" "$dir/bad.txt" || { echo "FAIL: the damage was not named: $(cat "$dir/bad.txt")"; exit 1; }
echo "tensorboard: ok"
