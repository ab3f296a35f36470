#!/usr/bin/env python3
"""GPT-2 124M training steps in PyTorch, the twin of loom's benchmark configs: fp32 on the CPU
(examples/configs/gpt2_124m.toml, B=4, T=256) or bf16 autocast on a GPU
(examples/configs/gpt2_124m_gpu.toml, B=16, T=1024); AdamW, clipping, same threads. On the
GPU it uses PyTorch's own fast paths where the installed version has them: fused causal
attention (scaled_dot_product_attention) and the fused AdamW, so loom is measured against
the strongest eager PyTorch rather than a naive one.
On the GPU, --compile runs the same model under torch.compile after the eager run, in the same
process and on the same shape (the GPU anchor of tools/device_check.sh), and --llama1b takes
the LLaMA-shaped 1.1B model of examples/configs/llama_1b_gpu.toml (B=4, T=2048: RMSNorm, RoPE,
grouped-query attention 32/4, SwiGLU 5632, vocabulary 32000) instead of GPT-2.
Prints one JSON line per run: {"tokens_per_s": ..., "mode": "eager" | "compile"}.
Usage: bench_pytorch.py THREADS STEPS [cpu|cuda] [--compile] [--llama1b]"""
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

args = [a for a in sys.argv[1:] if not a.startswith("--")]
flags = {a for a in sys.argv[1:] if a.startswith("--")}
threads, steps = int(args[0]), int(args[1])
device = args[2] if len(args) > 2 else "cpu"
LLAMA = "--llama1b" in flags
torch.set_num_threads(threads)
torch.manual_seed(0)
V, T, C, L, H, B = (50257, 1024, 768, 12, 12, 16) if device == "cuda" else (50257, 256, 768, 12, 12, 4)
if LLAMA:
    V, T, C, L, H, B = 32000, 2048, 2048, 22, 32, 4
KV, FF = 4, 5632  # the LLaMA shape's kv heads and SwiGLU width
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


class LlamaBlock(nn.Module):
    def __init__(self):
        super().__init__()
        D = C // H
        self.n1, self.n2 = nn.RMSNorm(C, eps=1e-5), nn.RMSNorm(C, eps=1e-5)
        self.qkv = nn.Linear(C, (H + 2 * KV) * D, bias=False)
        self.o = nn.Linear(C, C, bias=False)
        self.gate_up = nn.Linear(C, 2 * FF, bias=False)
        self.down = nn.Linear(FF, C, bias=False)
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D))
        ang = torch.outer(torch.arange(T).float(), inv)
        self.register_buffer("cos", torch.cat([ang.cos(), ang.cos()], -1), persistent=False)
        self.register_buffer("sin", torch.cat([ang.sin(), ang.sin()], -1), persistent=False)

    def rope(self, x):
        a, b = x.chunk(2, dim=-1)
        return x * self.cos + torch.cat([-b, a], -1) * self.sin

    def forward(self, x):
        D = C // H
        q, k, v = self.qkv(self.n1(x)).split([H * D, KV * D, KV * D], dim=2)
        q = self.rope(q.view(B, T, H, D).transpose(1, 2))
        k = self.rope(k.view(B, T, KV, D).transpose(1, 2))
        v = v.view(B, T, KV, D).transpose(1, 2)
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        g, u = self.gate_up(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.h = nn.ModuleList(LlamaBlock() for _ in range(L))
        self.norm = nn.RMSNorm(C, eps=1e-5)
        self.head = nn.Linear(C, V, bias=False)

    def forward(self, idx, tgt):
        x = self.emb(idx)
        for b in self.h:
            x = b(x)
        return F.cross_entropy(self.head(self.norm(x)).view(-1, V).float(), tgt.view(-1))


model = (Llama() if LLAMA else GPT()).to(device)
fused_adamw = device == "cuda" and "fused" in torch.optim.AdamW.__init__.__code__.co_varnames
extra = {"fused": True} if fused_adamw else {}
opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, **extra)
idx = torch.randint(0, V, (B, T), device=device)
tgt = torch.randint(0, V, (B, T), device=device)


def run(fn, mode):
    times = []
    for step in range(steps + (1 if mode == "compile" else 0)):  # compile: one more warm-up (compilation)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = fn(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    skip = 2 if mode == "compile" else 1  # step 1 is a warm-up, as in loom bench (compile: 2)
    timed = times[skip:] if len(times) > skip else times
    print(json.dumps({"tokens_per_s": B * T * len(timed) / sum(timed), "mode": mode,
                      "model": "llama1b" if LLAMA else "gpt2", "torch": torch.__version__,
                      "fused_attention": FUSED_ATTENTION or LLAMA, "fused_adamw": fused_adamw,
                      "compile_s": round(sum(times[:skip]), 1) if mode == "compile" else None}), flush=True)


run(model, "eager")
if "--compile" in flags:
    run(torch.compile(model), "compile")
