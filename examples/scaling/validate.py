#!/usr/bin/env python3
"""The step-time model against the sweeps: for every row of sweep.py's CSVs, `loom plan layout
--predict` on a cluster file, next to the measured step, with the relative error of the step
and each term. Writes one CSV and prints a markdown table.

  examples/scaling/validate.py $m --cluster examples/clusters/this_machine.toml \\
      examples/scaling/results/strong.csv examples/scaling/results/weak.csv \\
      --out runs/scaling/model_check.csv

--set flags give the sweeps' model (the same flags sweep.py had); a row's layout (dp, tp, pp,
zero, global batch) and its series' fixed keys are added per row. --cluster may be given once
per CSV (in order) or once for all. --out's folder is made; a file the project ships is
replaced only with --force.
"""
import argparse
import csv
import json
import os
import subprocess
import sys

import outputs


def predict(loom, cluster, sets):
    cmd = [loom, "plan", "layout", "--cluster", cluster, "--predict", "--json"] + [x for s in sets for x in ("--set", s)]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"validate: {' '.join(cmd)} failed:\n{done.stdout}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+", help="sweep.py outputs")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--cluster", action="append", required=True)
    ap.add_argument("--loom", default=os.path.join(outputs.REPO, "build", "loom"))
    ap.add_argument("--out", required=True, help="CSV file to write (its folder is made)")
    ap.add_argument("--force", action="store_true", help="replace --out even where it is a file the project ships")
    a = ap.parse_args()
    if len(a.cluster) not in (1, len(a.csv)):
        outputs.fail("validate", "give --cluster once, or once per CSV")
    outputs.out_check("validate", a.out, a.force, make=False)
    outputs.file_check("validate", a.loom, "--loom")
    for path in a.csv:
        outputs.file_check("validate", path, "CSV")
    for path in a.cluster:
        outputs.file_check("validate", path, "--cluster")
    outputs.folder_make("validate", a.out)  # last: a refusal leaves no folder behind
    rows = []
    for i, path in enumerate(a.csv):
        cluster = a.cluster[min(i, len(a.cluster) - 1)]
        for r in csv.DictReader(open(path)):
            _, *fixed = r["series"].split(";")
            keys = {k: r[k] for k in ("dp", "tp", "pp", "zero")}
            sets = a.set + [f for f in fixed if f.split("=")[0].split(".")[-1] not in keys]
            sets += [f"parallel.{k}={v}" for k, v in keys.items()] + [f"train.global_batch={r['global_batch']}"]
            p = predict(a.loom, cluster, sets)
            err = lambda k: p[k] / float(r[k]) - 1 if float(r[k]) > 0 else float("nan")
            rows.append(dict(source=path.split("/")[-1], mode=r["mode"], layout=r["layout"], ranks=r["ranks"],
                             measured_ms=float(r["step_ms"]), predicted_ms=p["step_ms"], error=err("step_ms"),
                             compute_ms=float(r["compute_ms"]), compute_pred_ms=p["compute_ms"],
                             comm_ms=float(r["comm_exposed_ms"]), comm_pred_ms=p["comm_exposed_ms"],
                             bubble_ms=float(r["bubble_ms"]), bubble_pred_ms=p["bubble_ms"]))
    cols = list(rows[0])
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.4g}" if isinstance(r[k], float) else r[k]) for k in cols})
    print("| points | layout | ranks | measured ms | predicted ms | error | compute m/p | comm m/p | bubble m/p |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['source'].removesuffix('.csv')} | {r['layout']} | {r['ranks']} | {r['measured_ms']:.0f} | "
              f"{r['predicted_ms']:.0f} | {100 * r['error']:+.0f}% | {r['compute_ms']:.0f} / {r['compute_pred_ms']:.0f} | "
              f"{r['comm_ms']:.0f} / {r['comm_pred_ms']:.0f} | {r['bubble_ms']:.0f} / {r['bubble_pred_ms']:.0f} |")
    within = sum(abs(r["error"]) <= 0.15 for r in rows)
    print(f"\nvalidate: {within} of {len(rows)} points within 15% of the measured step; -> {a.out}")


if __name__ == "__main__":
    main()
