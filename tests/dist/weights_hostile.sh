#!/usr/bin/env bash
# Hostile weights files and shapes that cannot fit, against every reader (train's init.from,
# eval, generate):
#   header: a repeated key (in the header or in an entry), tensors whose data offsets overlap,
#           shapes or offsets that are not non-negative integers, a FIFO as the file: refused
#           with a message, no crash, no hang (they used to load silently, the last key winning);
#   huge:   loom.model metadata describing a model the file does not hold, and
#           --set model.n_layer=1000000000, refused before anything is allocated (they were
#           OOM-killed or ended in std::bad_alloc); a plan larger than the memory a rank has
#           refused with the plan's numbers;
#   extra:  a file's tensors the model does not use are reported by every reader.
#   weights_hostile.sh LOOM
set -uo pipefail
loom=$1
. "$(dirname "$0")/../lib.sh"
test_dir
cd "$dir"
common=(--set model.n_layer=1 --set model.d_model=32 --set model.n_head=4 --set model.vocab_size=256
        --set model.seq_len=16 --set train.global_batch=4 --set train.micro_batch=4 --set train.threads=1
        --set train.device=cpu --set data.val_batches=1)
run_or_show good.log "$loom" train "${common[@]}" --set train.steps=2 \
  --set export.final=good.safetensors --set log.dir=good.run
run_or_show good.eval "$loom" eval --from good.safetensors

# Every reader must exit with status 2 (a refused input), quickly, saying WANT.
readers() {  # CASE FILE WANT [EXTRA ARGS for every reader]
  local name=$1 file=$2 want=$3
  shift 3
  for r in train eval generate; do
    local out=$name.$r.log
    case $r in
      train) timeout 60 "$loom" train "${common[@]}" --set train.steps=1 --set init.from="$file" \
               --set log.dir="$name.run" "$@" > "$out" 2>&1 ;;
      eval) timeout 60 "$loom" eval --from "$file" "$@" > "$out" 2>&1 ;;
      generate) timeout 60 "$loom" generate --from "$file" --prompt "ab" --max-new 2 "$@" > "$out" 2>&1 ;;
    esac
    local rc=$?
    if [ $rc = 124 ]; then fail "$name: $r hung"; continue; fi
    if [ $rc != 2 ]; then fail "$name: $r exited $rc, not 2"; tail -3 "$out"; continue; fi
    grep -q -- "$want" "$out" || { fail "$name: $r did not say '$want'"; tail -3 "$out"; }
  done
}
# A copy of the good file with its header edited by PYTHON (h: the header as a str, with every
# key as the writer put it; data: the bytes after it).
variant() {  # NAME PYTHON
  python3 - good.safetensors "$1.safetensors" "$2" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h, data = raw[8:8 + n].decode().rstrip(), raw[8 + n:]
j = json.loads(h)
w = "transformer.h.0.mlp.c_fc.weight"
exec(sys.argv[3])
h = h.encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + data)
PY
}

echo "header"
# A second entry under the same name, pointing at another tensor's bytes: the last would win.
variant repeated "e = dict(j['transformer.h.0.mlp.c_proj.weight']); e['shape'] = j[w]['shape']
h = h[:-1] + ',' + json.dumps(w) + ':' + json.dumps(e) + '}'"
readers repeated repeated.safetensors "key 'transformer.h.0.mlp.c_fc.weight' appears more than once"
variant repeated_field "h = h.replace('\"dtype\":\"F32\"', '\"dtype\":\"F32\",\"dtype\":\"F32\"', 1)"
readers repeated_field repeated_field.safetensors "key 'dtype' appears more than once"
variant overlap "o = j['transformer.h.0.mlp.c_proj.weight']['data_offsets']; j[w]['data_offsets'] = o
j[w]['shape'] = j['transformer.h.0.mlp.c_proj.weight']['shape'][::-1]; h = json.dumps(j)"
readers overlap overlap.safetensors "overlap; the file is corrupt"
variant fraction "j[w]['shape'] = [j[w]['shape'][0] + 0.5, j[w]['shape'][1]]; h = json.dumps(j)"
readers fraction fraction.safetensors "is not of non-negative integers"
variant negative "j[w]['data_offsets'] = [-4, j[w]['data_offsets'][1]]; h = json.dumps(j)"
readers negative negative.safetensors "data_offsets is not two non-negative integers"
variant stringy "j[w]['shape'] = [str(d) for d in j[w]['shape']]; h = json.dumps(j)"
readers stringy stringy.safetensors "is not of non-negative integers"
mkfifo fifo.safetensors
readers fifo fifo.safetensors "is not a regular file"

echo "huge"
# Metadata that describes 10^6 layers of the file's 1: refused from the headers alone.
variant huge_meta "m = j['__metadata__']; m['loom.model'] = m['loom.model'].replace('n_layer = 1', 'n_layer = 1000000')
h = json.dumps(j)"
for r in eval generate; do
  out=huge_meta.$r.log
  if [ $r = eval ]; then timeout 60 "$loom" eval --from huge_meta.safetensors > $out 2>&1
  else timeout 60 "$loom" generate --from huge_meta.safetensors --prompt ab --max-new 2 > $out 2>&1; fi
  rc=$?
  [ $rc = 2 ] || fail "huge_meta: $r exited $rc, not 2"
  grep -q "holds .* parameters and the model its loom.model metadata (or config.json) describe has 1.*e+" $out ||
    { fail "huge_meta: $r did not name the mismatch"; tail -3 $out; }
done
# A billion layers from the command line: every reader refuses before laying the model out.
readers billion good.safetensors "weights alone take\|the model its description, --config and --set describe" \
  --set model.n_layer=1000000000
timeout 60 "$loom" train "${common[@]}" --set model.n_layer=1000000000 --set log.dir=billion.run > billion.log 2>&1
rc=$?
[ $rc = 2 ] && grep -q "weights alone take" billion.log || { fail "train n_layer 1e9 exited $rc"; tail -3 billion.log; }
# Small weights, activations larger than the machine: the plan's numbers in the refusal.
timeout 60 "$loom" train "${common[@]}" --set model.seq_len=4096 --set train.micro_batch=4096 \
  --set train.global_batch=4096 --set log.dir=plan.run > plan.log 2>&1
rc=$?
[ $rc = 2 ] && grep -q "rank 0 plans .* GiB (.*activations [0-9.]*.* GiB) and has" plan.log ||
  { fail "a plan larger than memory exited $rc"; tail -3 plan.log; }

echo "extra"
# A tensor the model does not have: every reader says so (eval used to drop it silently).
python3 - good.safetensors extra.safetensors <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
j, data = json.loads(raw[8:8 + n]), raw[8 + n:]
j["stray.weight"] = {"dtype": "F32", "shape": [2], "data_offsets": [len(data), len(data) + 8]}
h = json.dumps(j).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + data + b"\0" * 8)
PY
"$loom" train "${common[@]}" --set train.steps=1 --set init.from=extra.safetensors --set log.dir=extra.run \
  > extra.train.log 2>&1 || fail "train refused a file with an extra tensor"
"$loom" eval --from extra.safetensors > extra.eval.log 2>&1 || fail "eval refused a file with an extra tensor"
"$loom" generate --from extra.safetensors --prompt ab --max-new 2 > extra.generate.log 2>&1 ||
  fail "generate refused a file with an extra tensor"
for r in train eval generate; do
  grep -q "1 tensor in .*unused.*stray.weight" extra.$r.log ||
    { fail "extra: $r did not report the unused tensor"; tail -3 extra.$r.log; }
done

echo "numbers"
# A temperature that is not a number sampled garbage while the log said "greedy".
for t in nan inf; do
  timeout 20 "$loom" generate --from good.safetensors --prompt ab --max-new 2 --temperature $t > temp.log 2>&1
  rc=$?
  [ $rc = 2 ] && grep -q "must be a finite number" temp.log || { fail "--temperature $t exited $rc"; tail -2 temp.log; }
done

finish ok
