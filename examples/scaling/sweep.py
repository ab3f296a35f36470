#!/usr/bin/env python3
"""Scaling sweeps: launches one training run per point, reads its metrics.jsonl and writes one
CSV row per point (layout, ranks, tokens/s, MFU, scaling efficiency against the series' first
point, and the measured step-time split).

  examples/scaling/sweep.py --config F.toml --set train.steps=12 \
      --sweep parallel.dp=1,2,4 --sweep parallel.tp=1,2,4 --strong --out runs/scaling/strong.csv

Each --sweep KEY=V1,V2,...[;K=V...] is a series of points, KEY taking each value in turn on top
of the config, the --set flags and the series' own K=V settings (e.g.
'parallel.dp=1,2,4;parallel.zero=3'); a point's ranks are parallel.dp x tp x pp. --weak multiplies
train.global_batch by the point's ranks over the series' first point's (the work per rank
stays), --strong keeps it. Points run with --launch (default "launch/mpirun.sh -np"; e.g.
"srun --mpi=pmix -n" inside an allocation) followed by the rank count. Steps before --skip
(default 2) are warm-up and left out of the means. --out's folder is made; a file the project
ships (examples/scaling/results/*.csv) is replaced only with --force. The arguments are
checked before the first point runs. The split: compute, exposed communication,
pipeline bubble, optimizer, data and checkpoint blocking (loom's step clock), and what of
step_ms none of them claims ("other").
"""
import argparse
import csv
import json
import os
import re
import shlex
import subprocess
import sys

import outputs

MPIRUN_SH = shlex.quote(os.path.join(outputs.REPO, "launch", "mpirun.sh"))

SPLIT = ["compute_ms", "comm_exposed_ms", "bubble_ms", "optimizer_ms", "data_ms", "ckpt_block_ms"]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="TOML config every point starts from")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="applied to every point")
    ap.add_argument("--sweep", action="append", required=True, metavar="KEY=V1,V2,...", help="one series")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--weak", action="store_true", help="global batch grows with the ranks")
    mode.add_argument("--strong", action="store_true", help="global batch fixed (the default)")
    ap.add_argument("--launch", default=MPIRUN_SH + " -np", help="launcher, followed by the rank count")
    ap.add_argument("--loom", default=os.path.join(outputs.REPO, "build", "loom"))
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the means")
    ap.add_argument("--out", required=True, help="CSV file (its folder is made); the runs go to a directory beside it")
    ap.add_argument("--force", action="store_true", help="replace --out even where it is a file the project ships")
    a = ap.parse_args()
    # Everything checked before the first point runs.
    outputs.out_check("sweep", a.out, a.force, make=False)
    outputs.file_check("sweep", a.loom, "--loom")
    if a.config:
        outputs.file_check("sweep", a.config, "--config")
    for series in a.sweep:
        swept, *fixed = series.split(";")
        if not swept.partition("=")[2] or any("=" not in f for f in fixed):
            outputs.fail("sweep", f"--sweep '{series}' is not KEY=V1,V2,...[;K=V...]")
    outputs.program_check("sweep", a.launch, "--launch")
    outputs.folder_make("sweep", a.out)  # last: a refusal leaves no folder behind
    return a


def setting(sets, key, default):
    for s in reversed(sets):
        k, _, v = s.partition("=")
        if k == key:
            return v
    return default


def config_value(path, key, default):
    """A key's value in a TOML file (the simple `key = value` lines loom's configs use)."""
    if not path:
        return default
    section, _, name = key.rpartition(".")
    current = ""
    with open(path) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if line.startswith("["):
                current = line.strip("[]").strip()
            elif "=" in line and current == section:
                k, _, v = line.partition("=")
                if k.strip() == name:
                    return v.strip().strip('"')
    return default


def read_metrics(path, skip):
    lines = open(path).read().splitlines()
    start = max((i for i, l in enumerate(lines) if '"run"' in l), default=-1) + 1
    rows = [json.loads(l) for l in lines[start:] if '"step_ms"' in l]
    rows = [r for r in rows if r["step"] > skip] or rows
    if not rows:
        sys.exit(f"sweep: {path} has no steps")
    mean = lambda f: sum(f(r) for r in rows) / len(rows)
    out = {k: mean(lambda r: r[k]) for k in ("tokens_per_s", "mfu", "step_ms")}
    for k in SPLIT:
        out[k] = mean(lambda r: r["time"][k])
    out["other_ms"] = max(0.0, out["step_ms"] - sum(out[k] for k in SPLIT))
    out["steps"] = len(rows)
    return out


def main():
    a = parse_args()
    runs = os.path.splitext(a.out)[0] + "_runs"
    os.makedirs(runs, exist_ok=True)
    base = ["--config", a.config] if a.config else []
    for s in a.set:
        base += ["--set", s]
    global_batch = int(setting(a.set, "train.global_batch", config_value(a.config, "train.global_batch", "16")))
    rows = []
    for series in a.sweep:
        swept, *fixed = series.split(";")
        key, _, values = swept.partition("=")
        first_ranks = None
        for v in values.split(","):
            sets = a.set + fixed + [f"{key}={v}"]
            dims = {d: int(setting(sets, f"parallel.{d}", config_value(a.config, f"parallel.{d}", "1")))
                    for d in ("dp", "tp", "pp")}
            zero = int(setting(sets, "parallel.zero", config_value(a.config, "parallel.zero", "0")))
            ranks = dims["dp"] * dims["tp"] * dims["pp"]
            first_ranks = first_ranks or ranks
            gb = global_batch * ranks // first_ranks if a.weak else global_batch
            name = "_".join(f"{k.split('.')[-1]}{x}" for k, _, x in (f.partition("=") for f in [f"{key}={v}"] + fixed))
            log = os.path.join(runs, name + ("_weak" if a.weak else "_strong"))
            extra = [x for f in fixed + [f"{key}={v}"] for x in ("--set", f)]
            cmd = (shlex.split(a.launch) + [str(ranks), a.loom, "train"] + base + extra +
                   ["--set", f"train.global_batch={gb}", "--set", f"log.dir={log}"])
            print("sweep:", " ".join(shlex.quote(c) for c in cmd), flush=True)
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if done.returncode != 0:
                sys.exit(f"sweep: point {name} failed ({done.returncode}):\n{done.stdout[-3000:]}")
            # Where the run wrote: a log.dir that holds an earlier sweep's run moves it to log.dir-2.
            said = re.search(r"metrics: (\S+)/metrics\.jsonl \(log\.dir\)", done.stdout)
            m = read_metrics(os.path.join(said.group(1) if said else log, "metrics.jsonl"), a.skip)
            rows.append(dict(series=series, layout=f"dp{dims['dp']} tp{dims['tp']} pp{dims['pp']} zero{zero}",
                             ranks=ranks, dp=dims["dp"], tp=dims["tp"], pp=dims["pp"], zero=zero, global_batch=gb,
                             mode="weak" if a.weak else "strong", **m))
        first = next(r for r in rows if r["series"] == series)
        for r in rows:
            if r["series"] == series:
                r["efficiency"] = (r["tokens_per_s"] / first["tokens_per_s"]) / (r["ranks"] / first["ranks"])
    cols = ["mode", "series", "layout", "ranks", "dp", "tp", "pp", "zero", "global_batch", "tokens_per_s", "mfu",
            "efficiency", "step_ms"] + SPLIT + ["other_ms", "steps"]
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.4g}" if isinstance(r[k], float) else r[k]) for k in cols})
    print(f"sweep: {len(rows)} points -> {a.out}")


if __name__ == "__main__":
    main()
