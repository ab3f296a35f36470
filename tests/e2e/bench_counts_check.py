#!/usr/bin/env python3
"""Checks `loom bench kernels --counts`'s output (tests/e2e/bench_counts.sh) against the counts table:
each of the table's launches is a row, in the table's order, with the figures recomputed from the
table's counts as the command words them; where the build has ptxas figures, every row has its
registers, CTAs per SM and both GPUs' predicted times, and the step lines follow.

usage: bench_counts_check.py KERNEL_COUNTS_CSV OUTPUT
"""
import csv
import re
import sys


def ratio(a, b, f="{:.2f}"):
    return f.format(a / b) if b > 0 else "-"


def expected_rows(table):
    rows = list(csv.DictReader(open(table)))
    dram = {}
    for r in rows:
        key = (r["model"], r["op"], r["shape"])
        dram[key] = dram.get(key, 0) + 32 * (float(r["ldg_sectors"]) + float(r["stg_sectors"]))
    out = []
    for r in rows:
        f = {k: float(v) for k, v in r.items() if k not in ("model", "op", "shape", "kernel")}
        ways = "/".join([ratio(f["ldmatrix_wavefronts"], f["ldmatrix_matrices"]),
                         ratio(f["cp_async_wavefronts"], f["cp_async_ideal"]),
                         ratio(f["lds_wavefronts"] + f["sts_wavefronts"], f["lds_ideal"] + f["sts_ideal"])])
        out.append({
            "op": r["op"][:30], "kernel": r["kernel"][:38], "blocks": f"{f['blocks']:.0f} x {int(f['threads'])}",
            "mma": f"{f['mma'] / 1e6:.2f}", "ldmatrix": f"{f['ldmatrix'] / 1e6:.2f}",
            "mma:ldm": ratio(f["mma"], f["ldmatrix"]), "ways": ways,
            "dram": f"{32 * (f['ldg_sectors'] + f['stg_sectors']) / 1e6:.1f}",
            "x min": ratio(dram[(r["model"], r["op"], r["shape"])], f["min_bytes"]),
            "trips": f"{f['trips_max']:.0f}"})
    return out


def main():
    table, output = sys.argv[1], sys.argv[2]
    text = open(output).read()
    # A launch row: op (up to 30 columns), kernel, then the columns the header names.
    pattern = re.compile(r"^(.{30}) (\S.{37}) +(\d+ x \d+) +(\S+) +(\S+) +(\S+) +(\S+) +(\S+) +(\S+) +(\S+) +(\S+) "
                         r"+(\S+) +(\S+) +(\S+) +(\S+)$")
    got = []
    for line in text.splitlines():
        m = pattern.match(line)
        if m:
            g = [s.strip() for s in m.groups()]
            got.append(dict(zip(["op", "kernel", "blocks", "mma", "ldmatrix", "mma:ldm", "ways", "dram", "x min",
                                 "trips", "regs", "ctas", "h200", "bound", "h100"], g)))
    want = expected_rows(table)
    failures = []
    if len(got) != len(want):
        failures.append(f"{len(got)} launch rows printed, the table has {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        for k, v in w.items():
            if g[k] != v.strip():
                failures.append(f"row {i + 1} ({w['op']} / {w['kernel']}): {k} is {g[k]}, the table gives {v}")
    modelled = "no ptxas figures" not in text
    if modelled:
        for g in got:
            if not (re.fullmatch(r"\d+s?", g["regs"]) and g["ctas"].isdigit() and int(g["ctas"]) > 0 and
                    re.fullmatch(r"[0-9.]+", g["h200"]) and re.fullmatch(r"[0-9.]+", g["h100"])):
                failures.append(f"{g['kernel']}: not modelled (regs {g['regs']}, CTAs {g['ctas']}, H200 {g['h200']})")
        for needle in ("gpt2_124m on H200 SXM, ms per step:", "llama_1b on H100 SXM, ms per step:",
                       "GPT-2 124M step (B16 T1024) on one H200"):
            if needle not in text:
                failures.append(f"no line '{needle}'")
        step = re.search(r"on one H200, .*?: ([0-9.]+) ms, ([0-9]+) tokens/s", text)
        if not step or not abs(16 * 1024 / (float(step.group(1)) / 1e3) / float(step.group(2)) - 1) < 0.01:
            failures.append("the GPT-2 step's ms and tokens/s do not agree (16384 tokens a step)")
    if not re.search(r"Counted in [0-9.]+ s on this CPU", text):
        failures.append("no 'Counted in ... s' line")
    if failures:
        print("\n".join("FAIL: " + f for f in failures[:40]))
        print(text)
        return 1
    print(f"{len(got)} launches as the table counts them{', each modelled' if modelled else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
