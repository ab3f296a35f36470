#!/usr/bin/env python3
"""Causal bf16 attention in PyTorch (scaled_dot_product_attention with its flash and its cuDNN
backend) at the shapes `loom bench kernels` measures, set beside loom's numbers in one table.
TFLOP/s count the causal half of the scores: forward 2*B*H*T*T*D, backward 2.5 times that;
backward is timed as forward+backward less forward. Grouped-query heads go in as PyTorch's
enable_gqa where the backend takes it, else K and V are expanded before the timing.
usage: attention_vs_torch.py LOOM_BENCH_LOG  (the output of `loom bench kernels`)"""
import re
import sys

import torch
import torch.nn.functional as F

LINE = re.compile(r"attention loom B(\d+) T(\d+) H(\d+) KV(\d+) D(\d+): fwd ([\d.]+) bwd ([\d.]+)")


def loom_rates(path):
    rates = {}
    with open(path) as f:
        for line in f:
            m = LINE.search(line)
            if m:
                rates[tuple(int(x) for x in m.groups()[:5])] = (float(m.group(6)), float(m.group(7)))
    return rates


def time_ms(fn, reps=10):
    fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def torch_rates(shape, backend, gqa):
    from torch.nn.attention import sdpa_kernel

    B, T, H, KV, D = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
    k = torch.randn(B, KV, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, KV, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
    kw = {"enable_gqa": True} if gqa and KV != H else {}
    if KV != H and not gqa:
        k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
    k.requires_grad_(True)
    v.requires_grad_(True)
    dout = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
    with sdpa_kernel(backend):
        fwd = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw))

        def both():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)
            out.backward(dout)

        total = time_ms(both)
    flops = 2.0 * B * H * T * T * D
    return flops / fwd / 1e9, 2.5 * flops / (total - fwd) / 1e9


def best_effort(shape, backend):
    """PyTorch's GQA path first; where the backend refuses it, K and V expanded beforehand."""
    err = None
    for gqa in (True, False):
        try:
            return torch_rates(shape, backend, gqa)
        except (RuntimeError, TypeError) as e:
            err = e
            torch.cuda.empty_cache()
    raise RuntimeError(str(err))


def main():
    loom = loom_rates(sys.argv[1])
    if not loom:
        sys.exit(f"no 'attention loom' lines in {sys.argv[1]}")
    backends = []
    from torch.nn.attention import SDPBackend

    for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
        if hasattr(SDPBackend, name):
            backends.append((name.split("_")[0].lower(), getattr(SDPBackend, name)))
    print(f"attention TFLOP/s (causal, bf16; fwd / bwd), torch {torch.__version__}, {torch.cuda.get_device_name()}")
    head = "| B, T, H, KV, D | loom | " + " | ".join(f"torch {n}" for n, _ in backends)
    head += " | " + " | ".join(f"loom / {n}" for n, _ in backends) + " |"
    print(head)
    print("|" + " --- |" * (2 + 2 * len(backends)))
    for shape, (lf, lb) in loom.items():
        cells, ratios = [], []
        for _, backend in backends:
            try:
                tf, tb = best_effort(shape, backend)
                cells.append(f"{tf:.0f} / {tb:.0f}")
                ratios.append(f"{lf / tf:.2f} / {lb / tb:.2f}")
            except RuntimeError as e:  # a backend that does not take this shape
                cells.append("n/a")
                ratios.append(str(e).splitlines()[0][:40])
            torch.cuda.empty_cache()
        print(f"| {', '.join(map(str, shape))} | {lf:.0f} / {lb:.0f} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main()
