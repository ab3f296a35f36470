#!/usr/bin/env python3
"""One micro-batch followed call by call through a step, on the source: Trainer::step in
train/step.cpp names the step's phases in the order they run; the micro-batches, their staging,
the reductions and the loss are defined there too, so the walk from the step to the first
kernel enters train/step.cpp once, parallel/pipeline.cpp (the one executor, at every pp) once,
and then the model; train/trainer_parts.h declares, it holds no step's body; the drills are
named points (train/drills.h), not calls threaded through the passes.

    step_walk.py SOURCE_DIR
"""
import re
import sys

src = sys.argv[1]
fails = []


def read(path):
    return open(f"{src}/{path}").read()


def body(text, signature):
    """The body of the function whose definition starts with `signature`."""
    at = text.find(signature)
    if at < 0:
        return None
    i = text.index("{", at)
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j + 1]
    return None


step_cpp = read("train/step.cpp")
step = body(step_cpp, "StepMetrics Trainer::step(int64_t step)")
if step is None:
    sys.exit("FAIL: Trainer::step is not defined in train/step.cpp")

# The step's phases, in the order a step runs them.
phases = [
    ("the drills at the step's start", r"drills->at\(StepPoint::begin"),
    ("the gradients of every micro-batch", r"\bp\.micro_batches\("),
    ("the reductions", r"\bp\.reduce_grads\(\)"),
    ("the loss", r"\bp\.loss_take\(\)"),
    ("the update guard", r"\bp\.guard\.check\("),
    ("the drills before the update", r"drills->at\(StepPoint::optimizer"),
    ("the update", r"dpar->apply\("),
    ("the checkpoint", r"ckpt->save\("),
    ("the metrics", r"\bp\.metrics_fill\("),
]
last, last_name = -1, ""
for name, pattern in phases:
    m = re.search(pattern, step)
    if not m:
        fails.append(f"Trainer::step does not call {name} ({pattern})")
        continue
    if m.start() < last:
        fails.append(f"Trainer::step calls {name} before {last_name}")
    last, last_name = m.start(), name

# What a micro-batch passes through in train/ is defined in step.cpp, and nowhere else.
for fn in ["micro_batches", "stage", "reduce_grads", "loss_take", "step_start"]:
    sig = f"Trainer::Parts::{fn}("
    if sig not in step_cpp:
        fails.append(f"Trainer::Parts::{fn} is not defined in train/step.cpp")
    for other in ["train/trainer.cpp", "train/recovery.cpp", "train/finish.cpp", "train/step_log.cpp",
                  "train/drills.cpp", "train/trainer_parts.h"]:
        if re.search(r"\b" + fn + r"\([^;]*\)\s*(const\s*)?\{", read(other)):
            fails.append(f"{other} defines {fn}: the step's passes live in train/step.cpp")

# One executor at every pp: the micro-batches go through PipelineStage::run, which calls the model.
mb = body(step_cpp, "void Trainer::Parts::micro_batches(")
if mb is None or "pipe->run(" not in mb:
    fails.append("micro_batches does not run the stage's ops through the pipeline executor")
if mb is not None and re.search(r"chunk->(forward|backward)\(", mb):
    fails.append("micro_batches calls the model itself: one executor runs every pp")
run = body(read("parallel/pipeline.cpp"), "void PipelineStage::run(")
if run is None or "chunk_.forward(" not in run or "chunk_.backward(" not in run:
    fails.append("PipelineStage::run does not call the chunk's forward and backward")
if "pp.size() == 1" in (run or "") or "pp_.size() == 1" in (run or ""):
    fails.append("PipelineStage::run has a path of its own for one stage")

# The drills: named points in the step, none threaded through the passes by hand.
for path in ["train/step.cpp", "parallel/pipeline.cpp"]:
    if re.search(r"faults->at\(|fi\.at\(|->nan\(|->bitflip\(", read(path)):
        fails.append(f"{path} calls a drill directly: drills attach at StepPoint (train/drills.h)")

# The parts header declares: no function there has a body of more than one statement.
parts = read("train/trainer_parts.h")
for m in re.finditer(r"\n  [A-Za-z][\w:<>&*, ]* (\w+)\([^;{}]*\)\s*(const\s*)?\{", parts):
    b = body(parts, m.group(0).strip())
    if b is not None and b.count(";") > 1 and m.group(1) not in ("info", "detail", "Parts", "~Parts"):
        fails.append(f"train/trainer_parts.h holds the body of {m.group(1)}: bodies go in the file of their phase")

for f in fails:
    print("FAIL:", f)
if fails:
    sys.exit(1)
print(f"the step reads in order: {len(phases)} phases; the passes in train/step.cpp, one executor, drills at points")
