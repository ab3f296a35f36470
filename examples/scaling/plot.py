#!/usr/bin/env python3
"""Plots a sweep's CSV (examples/scaling/sweep.py): throughput and scaling efficiency against
ranks, one line per series (PREFIX_throughput.png), and each point's measured step-time split
as stacked bars (PREFIX_split.png). Needs matplotlib: Debian's python3-matplotlib (./setup.sh
installs it); run under another Python without it (a virtual environment, pyenv), it runs itself
again under /usr/bin/python3 when that one has it, and otherwise says which to install or use.

  examples/scaling/plot.py runs/scaling/strong.csv [runs/scaling/weak.csv ...]   # PNGs beside each CSV
  examples/scaling/plot.py --out-dir runs/plots examples/scaling/results/strong.csv

PNGs the project ships (examples/scaling/results/*.png) are replaced only with --force.
"""
import argparse
import csv
import os
import subprocess
import sys

import outputs

SPLIT = [("compute_ms", "compute"), ("comm_exposed_ms", "exposed comm"), ("bubble_ms", "bubble"),
         ("optimizer_ms", "optimizer"), ("data_ms", "data"), ("ckpt_block_ms", "checkpoint"), ("other_ms", "other")]
DEBIAN_PYTHON = "/usr/bin/python3"


def matplotlib_or_rerun():
    """pyplot, or this script run again under Debian's Python where that one has matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        pass
    # A virtual environment's python may be Debian's binary, without Debian's packages: ask a
    # fresh /usr/bin/python3 (once: LOOM_PLOT_RERUN marks the second start).
    if (os.path.exists(DEBIAN_PYTHON) and not os.environ.get("LOOM_PLOT_RERUN") and
            subprocess.run([DEBIAN_PYTHON, "-c", "import matplotlib"], stderr=subprocess.DEVNULL).returncode == 0):
        print(f"plot: matplotlib is not in {sys.executable}; running under {DEBIAN_PYTHON}, which has it",
              file=sys.stderr)
        os.environ["LOOM_PLOT_RERUN"] = "1"
        os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON, os.path.abspath(__file__)] + sys.argv[1:])
    outputs.fail("plot", f"matplotlib is missing from {sys.executable}; apt-get install python3-matplotlib "
                         f"(./setup.sh does) and run this with {DEBIAN_PYTHON}, or install matplotlib into this Python")


def plot(plt, path, prefix):
    rows = list(csv.DictReader(open(path)))
    if not rows:
        sys.exit(f"plot: {path} has no points")
    mode = rows[0]["mode"]
    series = list(dict.fromkeys(r["series"] for r in rows))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for s in series:
        pts = [r for r in rows if r["series"] == s]
        ranks = [int(r["ranks"]) for r in pts]
        ax1.plot(ranks, [float(r["tokens_per_s"]) for r in pts], "o-", label=s)
        ax2.plot(ranks, [float(r["efficiency"]) for r in pts], "o-", label=s)
    ax1.set(xlabel="ranks", ylabel="tokens/s", title=f"{mode} scaling: throughput")
    ax2.set(xlabel="ranks", ylabel="efficiency", title=f"{mode} scaling: efficiency vs the first point")
    ax2.axhline(1.0, color="grey", lw=0.5)
    for ax in (ax1, ax2):
        ax.set_xticks(sorted({int(r["ranks"]) for r in rows}))
        ax.legend()
    fig.tight_layout()
    fig.savefig(prefix + "_throughput.png", dpi=110)
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(rows)), 4))
    labels = [r["layout"].replace(" ", "\n") for r in rows]
    bottom = [0.0] * len(rows)
    for key, name in SPLIT:
        vals = [float(r[key]) for r in rows]
        ax.bar(range(len(rows)), vals, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set(ylabel="ms per step", title=f"{mode} scaling: step-time split")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(prefix + "_split.png", dpi=110)
    print(f"plot: {prefix}_throughput.png, {prefix}_split.png")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+", help="sweep.py outputs")
    ap.add_argument("--out-dir", help="where the PNGs go (default: beside each CSV; the folder is made)")
    ap.add_argument("--force", action="store_true", help="replace PNGs even where the project ships them")
    a = ap.parse_args()
    # Everything checked before anything is drawn (or matplotlib looked for), and nothing made.
    prefixes = []
    for path in a.csv:
        outputs.file_check("plot", path, "CSV")
        stem = os.path.splitext(path)[0]
        prefix = os.path.join(a.out_dir, os.path.basename(stem)) if a.out_dir else stem
        for suffix in ("_throughput.png", "_split.png"):
            outputs.out_check("plot", prefix + suffix, a.force, "--out-dir" if a.out_dir else "the PNG",
                              "give --out-dir (e.g. runs/plots)", make=False)
        prefixes.append(prefix)
    plt = matplotlib_or_rerun()
    # Folders last: a refusal, or a Python without matplotlib, leaves none behind.
    for prefix in prefixes:
        outputs.folder_make("plot", prefix + "_throughput.png", "--out-dir" if a.out_dir else "the PNG")
    for path, prefix in zip(a.csv, prefixes):
        plot(plt, path, prefix)


if __name__ == "__main__":
    main()
