#!/usr/bin/env python3
"""Plots a sweep's CSV (examples/scaling/sweep.py): throughput and scaling efficiency against
ranks, one line per series (PREFIX_throughput.png), and each point's measured step-time split
as stacked bars (PREFIX_split.png). Needs Debian's python3-matplotlib (./setup.sh installs it).

  examples/scaling/plot.py runs/strong.csv [runs/weak.csv ...]   # PNGs beside each CSV
"""
import csv
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot: matplotlib is missing; apt-get install python3-matplotlib (./setup.sh does)")

SPLIT = [("compute_ms", "compute"), ("comm_exposed_ms", "exposed comm"), ("bubble_ms", "bubble"),
         ("optimizer_ms", "optimizer"), ("data_ms", "data"), ("ckpt_block_ms", "checkpoint"), ("other_ms", "other")]


def plot(path):
    rows = list(csv.DictReader(open(path)))
    if not rows:
        sys.exit(f"plot: {path} has no points")
    prefix = os.path.splitext(path)[0]
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


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        plot(p)
