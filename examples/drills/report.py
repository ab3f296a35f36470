#!/usr/bin/env python3
"""The report of one fault drill (examples/drills/drill.sh): reads OUT/run/faults.jsonl (the
fault, skip, sdc, straggler, rollback, resume and fallback events, and the supervisor's start
and exit of each run) and OUT/run/metrics.jsonl (every step's end time and step_ms), compares
the final weights with the fault-free run's, and writes OUT/report.json and one table row.

  time to detect:  from the fault to the first sign of it (a run's exit, a skipped update,
                   an SDC verdict, a straggler named, a checkpoint found bad at resume)
  time to recover: from that sign to the next step completed
  steps lost:      steps computed and thrown away (a failed run's steps after the checkpoint
                   the next one resumed from; a rollback's replayed steps; a skipped update)
  goodput:         productive time (the fault-free run's step time for the steps the drill
                   ended with) over the wall time from the first start to the last exit;
                   the fault-free run's own goodput is beside it
"""
import json
import sys

scenario, out = sys.argv[1], sys.argv[2]


def jsonl(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.strip()]
    except FileNotFoundError:
        return []


events = jsonl(f"{out}/run/faults.jsonl")
lines = jsonl(f"{out}/run/metrics.jsonl")
runs, run = [], None  # step records per run (metrics.jsonl starts each with a header)
for j in lines:
    if "run" in j:
        run = []
        runs.append(run)
    elif "loss" in j and run is not None:
        run.append(j)
steps = [s for r in runs for s in r]


def first(kind, after=0.0, **match):
    for e in events:
        if e["event"] == kind and e["t"] >= after and all(e.get(k) == v for k, v in match.items()):
            return e
    return None


# The drill's fault (fault.slow pacing a preemption drill is not it).
faults = [e for e in events if e["event"] == "fault"]
fault = next((e for e in faults if e.get("kind") not in ("slow",) or scenario == "slow"), None)
starts = [e for e in events if e["event"] == "start"]
exits = [e for e in events if e["event"] == "exit"]
t_fault = fault["t"] if fault else None
sign = None
if fault:
    # The straggler watch is the slow drill's sign only: on a shared machine it can flag the
    # faulted rank's slow step before the sign of any other fault.
    for kind in ("exit", "skip", "sdc") + (("straggler",) if scenario == "slow" else ()):
        e = first(kind, t_fault)
        if e and (kind != "exit" or e["status"] != 0):
            sign = e if sign is None or e["t"] < sign["t"] else sign
    if scenario == "ckpt_corrupt":  # found at the resume after the crash that follows it
        sign = first("fallback", t_fault) or sign
t_detect = sign["t"] if sign else None
after = [s for s in steps if t_detect is not None and s["t"] > t_detect]
t_recover = after[0]["t"] if after else None

lost = 0
resumes = [e for e in events if e["event"] == "resume"]
for i, r in enumerate(runs[:-1]):  # a failed run's steps past where the next one resumed
    if not r:
        continue
    nxt = [e for e in resumes if e["t"] > r[-1]["t"]]
    back = nxt[0]["step"] if nxt else 0
    lost += max(0, r[-1]["step"] - back)
rollbacks = [e for e in events if e["event"] == "rollback"]
for e in rollbacks:  # the steps it runs again, the skipped one among them
    lost += e["from"] - e["to"]
lost += sum(1 for e in events if e["event"] == "skip" and not any(r["to"] < e["step"] <= r["from"] for r in rollbacks))

# Productive time is what the steps take without the fault (the fault-free run's step_ms), so
# that the SDC check's recomputation or a straggler's wait count as lost, not as work.
last = {s["step"] for s in steps}
base_steps = [j for j in jsonl(f"{out}/base/metrics.jsonl") if "loss" in j]
productive = sum(s["step_ms"] for s in base_steps if s["step"] in last) / 1e3
wall = (exits[-1]["t"] - starts[0]["t"]) if starts and exits else None
goodput = productive / wall if wall else None
# The fault-free run's own goodput (start-up, the first step's warm-up and the final export
# are not steps): the drill's cost is the ratio.
with open(f"{out}/base/wall") as f:
    b0, b1 = (float(x) for x in f.read().split())
base_goodput = sum(s["step_ms"] for s in base_steps) / 1e3 / (b1 - b0)

with open(f"{out}/base/final.safetensors", "rb") as a, open(f"{out}/run/final.safetensors", "rb") as b:
    bitwise = a.read() == b.read()

report = {
    "scenario": scenario,
    "fault": fault,
    "restarts": max(0, len(starts) - 1),
    "detect_s": None if t_detect is None or t_fault is None else round(t_detect - t_fault, 3),
    "detected_by": sign["event"] if sign else None,
    "recover_s": None if t_recover is None else round(t_recover - t_detect, 3),
    "steps_lost": lost,
    "goodput": None if goodput is None else round(goodput, 3),
    "goodput_fault_free": round(base_goodput, 3),
    "goodput_ratio": None if goodput is None else round(goodput / base_goodput, 3),
    "wall_s": None if wall is None else round(wall, 2),
    "final_steps": max(last) if last else 0,
    "bitwise_equal": bitwise,
    "stragglers": sorted({r for s in steps for r in s.get("stragglers", [])}),
    "sdc_ranks": sorted({r for s in steps for r in s.get("sdc_ranks", [])}),
}
with open(f"{out}/report.json", "w") as f:
    json.dump(report, f, indent=1)


def fmt(v, unit=""):
    return "-" if v is None else f"{v}{unit}"


where = f"rank {fault['rank']} step {fault['step']}" if fault and fault.get("rank", -1) >= 0 else (
    f"step {fault['step']}" if fault else "-")
# The table's header, then the drill's row (a loop over drills keeps one header: `| tail -1`).
print("| drill | fault | detect | recover | restarts | steps lost | goodput (of fault-free) | final weights bitwise |")
print("| --- | --- | --- | --- | ---: | ---: | --- | --- |")
print(f"| {scenario} | {where} | {fmt(report['detect_s'], ' s')} ({report['detected_by'] or '-'}) | "
      f"{fmt(report['recover_s'], ' s')} | {report['restarts']} | {lost} | {fmt(report['goodput'])} of "
      f"{report['goodput_fault_free']} | "
      f"{'yes' if bitwise else 'no'} |")
