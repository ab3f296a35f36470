#!/usr/bin/env python3
"""Fits a cluster file for `loom plan layout` to this machine: the compute rate and memory
bandwidth from one single-rank training run, and alpha-beta per link tier from `loom bench
comm` (every collective, every message size, with the ring's step and volume counts).

  examples/scaling/calibrate.py $m --out runs/clusters/mine.toml      # then log.cluster=runs/clusters/mine.toml
  examples/scaling/calibrate.py $m --nodes 2 --per-node 2 \
      --inter-launch "examples/scaling/netns.sh mpirun -np" --out runs/clusters/nodes2_1gbit.toml

--out's folder is made; a file the project ships (examples/clusters/this_machine.toml) is
replaced only with --force. The arguments are checked before the first run. The training run's
logs go to a temporary folder (under $TMPDIR), removed however the script ends.

--set flags give the model of the training run (the sweeps' model). The fit:
  - peak: the cached per-core fp32 GEMM peak MFU divides by (`loom bench gemm` makes it);
  - mem_bw_gbs: the model's optimizer bytes over the run's measured optimizer time;
  - gemm_efficiency: the run's measured compute time against the model's at two trial
    efficiencies (compute is linear in 1 / efficiency);
  - [intra], [inter]: least squares (weighted by 1 / t) of t = steps * alpha + volume / bw
    over the bench comm rows, for the tier and for each collective (steps, volume: 2(n-1),
    2(n-1)/n x bytes for all-reduce, n-1, (n-1)/n x bytes otherwise; broadcast left out; a
    reduction's sums are in its rate).
    Each bench comm output is kept beside the cluster file (NAME.intraN.txt, NAME.interN.txt)
    and reused when present: delete them to measure again.
"""
import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile

import outputs

MPIRUN_SH = shlex.quote(os.path.join(outputs.REPO, "launch", "mpirun.sh"))


def run(cmd):
    print("calibrate:", " ".join(shlex.quote(c) for c in cmd), flush=True)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as child:
        try:
            out = child.communicate()[0]
        except BaseException:
            # Ctrl-C or SIGTERM: the child is asked to end now and waited for (launch/mpirun.sh
            # then ends its ranks and removes its own temporary files), killed only if it hangs.
            if child.poll() is None:
                child.terminate()
                try:
                    child.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    child.kill()
            raise
    if child.returncode != 0:
        sys.exit(f"calibrate: failed ({child.returncode}):\n{out[-3000:]}")
    return out


def bench_rows(text, n):
    """(steps, volume, seconds, collective) of each bench comm row but broadcast's."""
    rows = []
    for line in text.splitlines():
        f = line.split()
        if len(f) == 5 and f[0] in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
            size, us = float(f[1]), float(f[2])
            part = (n - 1) / n * size
            steps, vol = (2 * (n - 1), 2 * part) if f[0] == "all_reduce" else (n - 1, part)
            rows.append((steps, vol, us * 1e-6, f[0]))
    if not rows:
        sys.exit("calibrate: bench comm printed no rows:\n" + text[-2000:])
    return rows


def solve(A, b):
    """Gaussian elimination with partial pivoting (A small and square)."""
    n = len(b)
    M = [row[:] + [b[i]] for i, row in enumerate(A)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(M[r][c]))
        M[c], M[p] = M[p], M[c]
        for r in range(n):
            if r != c:
                f = M[r][c] / M[c][c]
                M[r] = [x - f * y for x, y in zip(M[r], M[c])]
    return [M[i][n] / M[i][i] for i in range(n)]


def lsq(X, y, w):
    """The c minimising sum(w * (X c - y)^2)."""
    k = len(X[0])
    A = [[sum(wi * x[i] * x[j] for x, wi in zip(X, w)) for j in range(k)] for i in range(k)]
    return solve(A, [sum(wi * x[i] * yi for x, yi, wi in zip(X, y, w)) for i in range(k)])


def fit_ab(rows):
    """alpha and 1/bw of t = steps * alpha + volume / bw, least squares weighted by 1 / t
    (between absolute errors, which only the largest messages would set, and relative ones,
    which the smallest would: a shaped link lets small messages through at line rate); a
    latency lost in the noise leaves the bandwidth alone."""
    w = [1 / t for *_, t in rows]
    a, g = lsq([[s, v] for s, v, t in rows], [t for *_, t in rows], w)
    if a <= 0:
        a = 0.0
        g = sum(wi * v * t for (s, v, t), wi in zip(rows, w)) / sum(wi * v * v for (s, v, t), wi in zip(rows, w))
    return a, g


def fit(rows):
    """The tier's alpha and bw over every collective, then each collective's own (MPI runs a
    different algorithm for each, its sums included in its rate). Returns alpha, bw,
    {collective: (alpha, bw)} and the worst row's relative error under the latter."""
    a, g = fit_ab([(s, v, t) for s, v, t, o in rows])
    per_op, worst = {}, 0.0
    for op in sorted({o for *_, o in rows}):
        mine = [(s, v, t) for s, v, t, o in rows if o == op]
        ao, go = fit_ab(mine)
        per_op[op] = (ao, 1 / go)
        worst = max([worst] + [abs((s * ao + v * go) / t - 1) for s, v, t in mine])
    return a, 1 / g, per_op, worst


def bench(cmd, record):
    """bench comm's output, kept beside the cluster file (reused when it is there already)."""
    if os.path.exists(record):
        print(f"calibrate: reusing {record}")
        return open(record).read()
    out = run(cmd)
    with open(record, "w") as f:
        f.write(out)
    return out


def measured(log, skip=2):
    lines = open(os.path.join(log, "metrics.jsonl")).read().splitlines()
    rows = [json.loads(l) for l in lines if '"step_ms"' in l]
    rows = [r for r in rows if r["step"] > skip] or rows
    mean = lambda k: sum(r["time"][k] for r in rows) / len(rows)
    return mean("compute_ms") * 1e-3, mean("optimizer_ms") * 1e-3


def machine_name():
    """This machine as loom's machine_name() says it: the runs log.cluster = "auto" compares
    (LOOM_MACHINE_NAME and LOOM_CORES count as they do there)."""
    if os.environ.get("LOOM_MACHINE_NAME"):
        return os.environ["LOOM_MACHINE_NAME"]
    model = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and ":" in line:
                model = line.split(":", 1)[1].strip()
                break
    cores = os.environ.get("LOOM_CORES") or len(os.sched_getaffinity(0))
    return f"{model}, {cores} cores"


def toml(c):
    out = [f"# {c['comment']}", f'name = "{c["name"]}"', f'fitted_on = "{machine_name()}"']
    for k in ("nodes", "devices_per_node", "physical_devices"):
        out.append(f"{k} = {c[k]}")
    out += ['device = "cpu"', 'dtype = "f32"']
    for k in ("peak_tflops", "gemm_efficiency", "mem_bw_gbs", "overlap"):
        out.append(f"{k} = {c[k]:.6g}")
    for tier in ("intra", "inter"):
        if tier in c:
            a, bw, per_op, err = c[tier]
            out += ["", f"[{tier}]  # fitted to bench comm, worst row {100 * err:.0f}% off", f"alpha_us = {a * 1e6:.4g}",
                    f"bw_gbs = {bw / 1e9:.4g}"]
            for op, (ao, bo) in per_op.items():
                out += [f"{op}_alpha_us = {ao * 1e6:.4g}", f"{op}_gbs = {bo / 1e9:.4g}"]
    return "\n".join(out) + "\n"


def predict(loom, cluster, sets, scratch):
    path = os.path.join(scratch, "trial.toml")
    with open(path, "w") as f:
        f.write(toml(cluster))
    out = run([loom, "plan", "layout", "--cluster", path, "--predict", "--json"] + sets)
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="the training run's model")
    ap.add_argument("--loom", default=os.path.join(outputs.REPO, "build", "loom"))
    ap.add_argument("--launch", default=MPIRUN_SH + " -np", help="launcher within one node")
    ap.add_argument("--ranks", default="2", help="bench comm sizes within one node (ranks beyond the cores "
                    "measure their sharing, which the model adds itself)")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--per-node", type=int, default=4, help="ranks per node (the cluster's devices_per_node)")
    ap.add_argument("--inter-launch", help="launcher across the nodes (for [inter])")
    ap.add_argument("--max-mb", default="16")
    ap.add_argument("--overlap", type=float, default=0.0,
                    help="share of overlappable communication that hides (0 here: with one thread per rank on "
                         "its own core, a rank's communication thread takes its time from the same core)")
    ap.add_argument("--out", required=True, help="the cluster file to write (its folder is made)")
    ap.add_argument("--force", action="store_true", help="replace --out even where it is a file the project ships")
    a = ap.parse_args()
    sets = [x for s in a.set for x in ("--set", s)]
    # Everything checked before the first run: a calibration takes minutes.
    outputs.file_check("calibrate", a.loom, "--loom")
    outputs.program_check("calibrate", a.launch, "--launch")
    if a.inter_launch:
        outputs.program_check("calibrate", a.inter_launch, "--inter-launch")
    if not all(x.strip().isdigit() and int(x) > 0 for x in a.ranks.split(",")):
        outputs.fail("calibrate", f"--ranks {a.ranks}: rank counts, as 2 or 2,4")
    if a.nodes < 1 or a.per_node < 1:
        outputs.fail("calibrate", f"--nodes {a.nodes} --per-node {a.per_node}: both count, from 1")
    if not 0 <= a.overlap <= 1:
        outputs.fail("calibrate", f"--overlap {a.overlap}: a share, from 0 to 1")
    try:
        max_mb = float(a.max_mb)
    except ValueError:
        max_mb = float("nan")
    if not 0 < max_mb <= 16384:
        outputs.fail("calibrate", f"--max-mb {a.max_mb}: megabytes, above 0 and at most 16384 (loom bench comm's)")
    # The training run's config, as loom reads it (a key that does not exist, a shape that does not divide).
    checked = subprocess.run([a.loom, "train", "--print-config"] + sets, capture_output=True, text=True)
    if checked.returncode != 0:
        why = (checked.stderr.strip().splitlines() or ["status %d" % checked.returncode])[-1]
        outputs.fail("calibrate", f"--set: {why.removeprefix('error: ')}")
    outputs.out_check("calibrate", a.out, a.force)  # last: it makes the folder

    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "loom", "cpu_peak.json")
    if not os.path.exists(cache):
        run([a.loom, "bench", "gemm", "--threads", "1"])
    peak = max(v["peak"] for k, v in json.load(open(cache)).items() if k.endswith("| per core"))

    # The training run's logs and the trial cluster files: removed however this ends (a failed
    # run, Ctrl-C, SIGTERM), as they are only the fit's inputs.
    with tempfile.TemporaryDirectory(prefix="calibrate_") as scratch:
        calibrate(a, sets, peak, scratch)


def calibrate(a, sets, peak, scratch):
    log = os.path.join(scratch, "run")
    run([a.loom, "train"] + sets + ["--set", "train.threads=1", "--set", f"log.dir={log}"])
    compute, optimizer = measured(log)

    intra = []
    for n in (int(x) for x in a.ranks.split(",")):
        out = bench(shlex.split(a.launch) + [str(n), a.loom, "bench", "comm", "--max-mb", a.max_mb],
                    f"{os.path.splitext(a.out)[0]}.intra{n}.txt")
        intra += bench_rows(out, n)
    c = dict(comment="", name=os.path.splitext(os.path.basename(a.out))[0], nodes=a.nodes, devices_per_node=a.per_node,
             physical_devices=os.cpu_count(), peak_tflops=peak / 1e12, gemm_efficiency=1.0, mem_bw_gbs=10.0,
             overlap=a.overlap, intra=fit(intra))
    if a.inter_launch:
        n = a.nodes * a.per_node
        out = bench(shlex.split(a.inter_launch) + [str(n), a.loom, "bench", "comm", "--max-mb", a.max_mb],
                    f"{os.path.splitext(a.out)[0]}.inter{n}.txt")
        # Measured with n ranks on the cores: the model scales a message's overhead by that
        # sharing itself (not the link's bandwidth), so alpha is stored unshared.
        share = min(1.0, os.cpu_count() / n)
        alpha, bw, per_op, err = fit(bench_rows(out, n))
        c["inter"] = (alpha * share, bw, {op: (ao * share, bo) for op, (ao, bo) in per_op.items()}, err)
    # The optimizer's bytes scale with 1 / mem_bw; compute is A / efficiency + element-wise D.
    p = predict(a.loom, c, sets, scratch)
    c["mem_bw_gbs"] *= p["optimizer_ms"] * 1e-3 / optimizer
    c1 = predict(a.loom, c, sets, scratch)["compute_ms"] * 1e-3
    c["gemm_efficiency"] = 0.5
    c2 = predict(a.loom, c, sets, scratch)["compute_ms"] * 1e-3
    A, D = c2 - c1, 2 * c1 - c2
    c["gemm_efficiency"] = min(1.0, A / max(compute - D, 1e-9))
    c["comment"] = (f"Fitted by examples/scaling/calibrate.py on this machine ({os.cpu_count()} cores, one thread "
                    f"per rank): compute {1e3 * compute:.4g} ms and optimizer {1e3 * optimizer:.4g} ms of one rank, "
                    f"bench comm at {a.ranks} ranks" + (f" and {a.nodes} x {a.per_node} across nodes" if a.inter_launch
                                                       else ""))
    with open(a.out, "w") as f:
        f.write(toml(c))
    print(f"calibrate: wrote {a.out}")
    print(toml(c))


if __name__ == "__main__":
    # SIGTERM unwinds as Ctrl-C does, so the scratch folder goes either way.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        main()
    except KeyboardInterrupt:
        print("calibrate: stopped by Ctrl-C; no cluster file written", file=sys.stderr)
        sys.exit(130)
