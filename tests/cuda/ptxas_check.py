#!/usr/bin/env python3
"""Register and spill check of every CUDA kernel for sm_90, without a GPU.

Compiles each kernels/cuda/*.cu with nvcc -arch=sm_90 -Xptxas -v and reads, per kernel, the
registers per thread and the spill stores. Each kernel must launch at the largest block loom
gives it (the emulation's launch table, from the real wrappers at every model shape): its
registers, allocated per warp in units of 256, times its warps, within the 65536 of an SM,
and at most 255 per thread. Spills above the threshold fail: a spill is local memory traffic
in the inner loop. A kernel ptxas reports that the table lacks (never launched) fails too. With
--counts, an instantiation the counts table launches is held at that launch's block instead.

With --table FILE it also writes, per kernel instantiation (named as the emulation's counts name
it: "attention_forward_flash_kernel<64>", namespaces dropped), its registers, spill stores and
static shared memory as CSV, the figures `loom bench kernels --counts` derives occupancy from;
--table-only writes the table and checks nothing (no launch table needed). --cpp FILE writes the
same table as a C++ source defining loom::ptxas_sm90_table() (the build compiles it into `loom`).

With --occupancy KERNEL=CTAS (repeatable) and --counts tests/cuda/kernel_counts.csv, the named
instantiation must compile without spills and fit at least CTAS blocks per SM at the threads and
dynamic shared memory its launches in the counts table ask for (registers, threads and shared
memory of an sm_90 SM, each CTA reserving 1 KB).

usage: ptxas_check.py NVCC SOURCE_DIR [LAUNCH_TABLE_PROGRAM] [--max-spill-bytes N] [--table FILE] [--cpp FILE]
                      [--table-only]
                      [--counts CSV --occupancy KERNEL=CTAS ...]
"""
import argparse
import csv
import glob
import os
import re
import subprocess
import sys

REGS_PER_SM = 65536
ALLOC_UNIT = 256  # registers are allocated per warp in units of 256
THREADS_PER_SM = 2048
BLOCKS_PER_SM = 32
SMEM_PER_SM = 228 * 1024
SMEM_PER_CTA_RESERVED = 1024


def blocks_per_sm(regs, threads, smem):
    """CTAs an sm_90 SM holds at once: the least of the register, thread, shared-memory and block limits."""
    warps = (threads + 31) // 32
    per_warp = -(-regs * 32 // ALLOC_UNIT) * ALLOC_UNIT
    return min(REGS_PER_SM // (per_warp * warps), THREADS_PER_SM // threads,
               SMEM_PER_SM // (smem + SMEM_PER_CTA_RESERVED), BLOCKS_PER_SM)


def launch_shapes(counts_csv):
    """Per kernel instantiation, the largest (threads, dynamic shared bytes) the counts table launches it with."""
    shapes = {}
    with open(counts_csv) as f:
        for row in csv.DictReader(f):
            shape = (int(row["threads"]), int(row["dynamic_shared"]))
            shapes[row["kernel"]] = max(shapes.get(row["kernel"], shape), shape)
    return shapes


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def base_name(demangled):
    # "void loom::cuda::(anonymous namespace)::attention_forward_tc<64>(...)" -> attention_forward_tc;
    # "void loom::cuda::column_partials_kernel<loom::cuda::(anonymous namespace)::NormGrad>(...)"
    # -> column_partials_kernel: cut the parameters and the template arguments, keep the last name.
    depth, end = 0, len(demangled)
    for i, ch in enumerate(demangled):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and not demangled.startswith("(anonymous", i):
            end = i
            break
    head = demangled[:end]
    if head.endswith(">"):
        depth = 0
        for i in range(len(head) - 1, -1, -1):
            depth += head[i] == ">"
            depth -= head[i] == "<"
            if depth == 0:
                head = head[:i]
                break
    return head.split("::")[-1].split()[-1]


def instance_name(demangled):
    """The instantiation without namespaces or parameters, as kernels/emu/counts.cpp's kernel_instance."""
    depth, end = 0, len(demangled)
    for i, ch in enumerate(demangled):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and not demangled.startswith("(anonymous", i):
            end = i
            break
    head = demangled[:end]
    if head.startswith("void "):
        head = head[5:]
    return re.sub(r"(\(anonymous namespace\)|\{anonymous\}|[A-Za-z_][A-Za-z_0-9]*)::", "", head)


def ptxas_report(nvcc, src, root):
    cmd = [nvcc, "-std=c++17", "-arch=sm_90", "-Xptxas", "-v", "-c", src, "-o", os.devnull, "-I", root]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"nvcc failed on {src}:\n{r.stderr}")
    kernels, current = {}, None
    for line in r.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\S+)' for 'sm_90'", line)
        if m:
            current = m.group(1)
            kernels[current] = {"regs": 0, "spill": 0, "smem": 0}
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            current = m.group(1) if m.group(1) in kernels else None
            continue
        if current is None:
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m:
            kernels[current]["regs"] = int(m.group(1))
        m = re.search(r"(\d+) bytes spill stores", line)
        if m:
            kernels[current]["spill"] = int(m.group(1))
        m = re.search(r"(\d+) bytes smem", line)
        if m:
            kernels[current]["smem"] = int(m.group(1))
    return kernels


def cpp_source(table):
    return ("// Written by tests/cuda/ptxas_check.py --cpp when a kernel changes: each kernel instantiation's\n"
            "// sm_90 registers, spill stores and static shared memory, for `loom bench kernels --counts`.\n"
            "namespace loom {\nconst char* ptxas_sm90_table() {\n  return R\"ptxas(" + table + ")ptxas\";\n}\n}\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("nvcc")
    ap.add_argument("source_dir")
    ap.add_argument("launch_table", nargs="?", help="loom_launch_table: prints the table as CSV")
    ap.add_argument("--max-spill-bytes", type=int, default=0)
    ap.add_argument("--table", help="write each instantiation's registers, spills and static shared memory (CSV)")
    ap.add_argument("--cpp", help="write the table as a C++ source defining loom::ptxas_sm90_table()")
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--counts", help="tests/cuda/kernel_counts.csv: the launches --occupancy holds")
    ap.add_argument("--occupancy", action="append", default=[], metavar="KERNEL=CTAS",
                    help="this instantiation: no spills and at least CTAS blocks per SM")
    a = ap.parse_args()
    if a.occupancy and not a.counts:
        ap.error("--occupancy needs --counts")
    table = {}
    if not a.table_only:
        out = subprocess.run([a.launch_table], capture_output=True, text=True, check=True).stdout
        table = {row["kernel"]: int(row["threads"]) for row in csv.DictReader(out.splitlines())}
    failures, rows, instances = [], [], {}
    counted = launch_shapes(a.counts) if a.counts else {}
    for src in sorted(glob.glob(os.path.join(a.source_dir, "kernels", "cuda", "*.cu"))):
        report = ptxas_report(a.nvcc, src, a.source_dir)
        names = list(report)
        for mangled, pretty in zip(names, demangle(names)):
            k = report[mangled]
            instances[instance_name(pretty)] = k
            if a.table_only:
                continue
            base = base_name(pretty)
            # The launch table keys a kernel by its name alone; where the counts table launches this
            # instantiation, its own block holds (the norms' backward takes 16 warps at 3 words a
            # lane and 8 at 8, and the 8-word one does not fit 16).
            threads = counted.get(instance_name(pretty), (table.get(base),))[0]
            if threads is None:
                failures.append(f"{pretty}: ptxas compiled it but the launch table never launches it")
                continue
            warps = (threads + 31) // 32
            per_warp = -(-k["regs"] * 32 // ALLOC_UNIT) * ALLOC_UNIT
            need = per_warp * warps
            rows.append(f"{base:36s} {k['regs']:4d} regs x {threads:5d} threads = {need:6d} of {REGS_PER_SM}, "
                        f"spill {k['spill']} B")
            if k["regs"] > 255 or need > REGS_PER_SM:
                failures.append(f"{pretty}: {k['regs']} registers per thread cannot launch {threads} threads "
                                f"({need} registers of {REGS_PER_SM})")
            if k["spill"] > a.max_spill_bytes:
                failures.append(f"{pretty}: {k['spill']} bytes of spill stores (threshold {a.max_spill_bytes})")
    text = "kernel,registers,spill_bytes,static_shared\n" + "".join(
        f"\"{name}\",{instances[name]['regs']},{instances[name]['spill']},{instances[name]['smem']}\n"
        for name in sorted(instances))
    for path, body in ((a.table, text), (a.cpp, cpp_source(text))):
        if not path:
            continue
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(body)
        os.replace(tmp, path)
    if a.table_only:
        return 0
    shapes = launch_shapes(a.counts) if a.counts else {}
    for spec in a.occupancy:
        name, want = spec.rsplit("=", 1)
        k, shape = instances.get(name), shapes.get(name)
        if k is None or shape is None:
            failures.append(f"{name}: {'ptxas' if k is None else 'the counts table'} has no such kernel")
            continue
        threads, smem = shape[0], shape[1] + k["smem"]
        got = blocks_per_sm(k["regs"], threads, smem)
        rows.append(f"{name:36s} {got} blocks per SM ({k['regs']} regs x {threads} threads, {smem} B shared), "
                    f"spill {k['spill']} B")
        if k["spill"] > 0:
            failures.append(f"{name}: {k['spill']} bytes of spill stores (its occupancy is held with none)")
        if got < int(want):
            failures.append(f"{name}: {got} blocks per SM ({k['regs']} registers x {threads} threads, {smem} bytes "
                            f"of shared memory), at least {want} held")
    print("\n".join(rows))
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        return 1
    print(f"{len(rows)} kernels fit sm_90 at their largest launch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
