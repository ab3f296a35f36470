#!/usr/bin/env python3
"""GPT-2 124M training steps in PyTorch, the twin of loom's benchmark configs: fp32 on the CPU
(examples/configs/gpt2_124m.toml, B=4, T=256) or bf16 autocast on a GPU
(examples/configs/gpt2_124m_gpu.toml, B=16, T=1024); AdamW, clipping, same threads. On the
GPU it uses PyTorch's own fast paths where the installed version has them: fused causal
attention (scaled_dot_product_attention) and the fused AdamW, so loom is measured against
the strongest eager PyTorch rather than a naive one.
Prints one JSON line: {"tokens_per_s": ...}. Usage: bench_pytorch.py THREADS STEPS [cpu|cuda]"""
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

threads, steps = int(sys.argv[1]), int(sys.argv[2])
device = sys.argv[3] if len(sys.argv) > 3 else "cpu"
torch.set_num_threads(threads)
torch.manual_seed(0)
V, T, C, L, H, B = (50257, 1024, 768, 12, 12, 16) if device == "cuda" else (50257, 256, 768, 12, 12, 4)
FUSED_ATTENTION = device == "cuda" and hasattr(F, "scaled_dot_product_attention")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).tril())

    def forward(self, x):
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        if FUSED_ATTENTION:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
            y = F.softmax(att.masked_fill(~self.mask, float("-inf")), dim=-1) @ v
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(C)

    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, V), tgt.view(-1))


model = GPT().to(device)
fused_adamw = device == "cuda" and "fused" in torch.optim.AdamW.__init__.__code__.co_varnames
extra = {"fused": True} if fused_adamw else {}
opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, **extra)
idx = torch.randint(0, V, (B, T), device=device)
tgt = torch.randint(0, V, (B, T), device=device)
times = []
for step in range(steps):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
        loss = model(idx, tgt)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if device == "cuda":
        torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
timed = times[1:] if len(times) > 1 else times  # step 1 is a warm-up, as in loom bench
print(json.dumps({"tokens_per_s": B * T * len(timed) / sum(timed), "torch": torch.__version__,
                  "fused_attention": FUSED_ATTENTION, "fused_adamw": fused_adamw}))
