#!/usr/bin/env python3
"""PyTorch reference for loom's parity tests.

Builds a small gpt2, llama (GQA) or mixtral (llama with Mixtral's sparse MoE blocks: E
experts, top-k routing renormalized, the Switch load-balancing loss) model with Hugging Face
tensor names, writes its initial weights (safetensors) and a token shard (llm.c format),
trains it with torch.optim.AdamW, clip_grad_norm_ and loom's LR schedule on loom's batch
order, and writes the per-step losses (for mixtral also the load-balancing loss) and final
weights. The outputs are small and committed under tests/fixtures/, so the tests need no
PyTorch. Run: python3 tests/reference/torch_reference.py {gpt2|llama|mixtral} OUT_DIR
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

ARCH = sys.argv[1]
OUT = sys.argv[2]
torch.manual_seed(0)
torch.set_num_threads(1)

V, T, C, L, H = 96, 16, 32, 2, 4
MOE = ARCH == "mixtral"
KV = 2 if ARCH != "gpt2" else 4
E, K, AUX = 4, 2, 0.01  # mixtral: experts, top-k, load-balancing loss weight
D = C // H
FF = 64 if ARCH != "gpt2" else 4 * C
TIE = ARCH == "gpt2"
B, G, STEPS = 4, 8, 12  # micro-batch 4, global batch 8: two accumulation micro-batches
HP = dict(lr=3e-3, min_lr=3e-4, warmup=2, wd=0.1, b1=0.9, b2=0.95, eps=1e-8, clip=1.0)


def lr_at(step):  # loom's cosine schedule with linear warmup (optim/adamw.cpp)
    if step < HP["warmup"]:
        return HP["lr"] * (step + 1) / HP["warmup"]
    progress = min(1.0, (step - HP["warmup"]) / max(1, STEPS - HP["warmup"]))
    return HP["min_lr"] + 0.5 * (HP["lr"] - HP["min_lr"]) * (1 + math.cos(math.pi * progress))


def init_params():
    g = torch.Generator().manual_seed(1)
    P = {}

    def normal(name, shape, std=0.02):
        P[name] = torch.randn(shape, generator=g) * std

    def near(name, shape, base):  # norm gains and biases off their defaults, so every grad is exercised
        P[name] = base + 0.1 * torch.randn(shape, generator=g)

    if ARCH == "gpt2":
        normal("transformer.wte.weight", (V, C))
        normal("transformer.wpe.weight", (T, C), 0.01)
        for i in range(L):
            p = f"transformer.h.{i}."
            near(p + "ln_1.weight", (C,), 1.0); near(p + "ln_1.bias", (C,), 0.0)
            normal(p + "attn.c_attn.weight", (C, 3 * C)); near(p + "attn.c_attn.bias", (3 * C,), 0.0)
            normal(p + "attn.c_proj.weight", (C, C)); near(p + "attn.c_proj.bias", (C,), 0.0)
            near(p + "ln_2.weight", (C,), 1.0); near(p + "ln_2.bias", (C,), 0.0)
            normal(p + "mlp.c_fc.weight", (C, FF)); near(p + "mlp.c_fc.bias", (FF,), 0.0)
            normal(p + "mlp.c_proj.weight", (FF, C)); near(p + "mlp.c_proj.bias", (C,), 0.0)
        near("transformer.ln_f.weight", (C,), 1.0); near("transformer.ln_f.bias", (C,), 0.0)
    else:
        normal("model.embed_tokens.weight", (V, C))
        for i in range(L):
            p = f"model.layers.{i}."
            near(p + "input_layernorm.weight", (C,), 1.0)
            normal(p + "self_attn.q_proj.weight", (H * D, C))
            normal(p + "self_attn.k_proj.weight", (KV * D, C))
            normal(p + "self_attn.v_proj.weight", (KV * D, C))
            normal(p + "self_attn.o_proj.weight", (C, H * D))
            near(p + "post_attention_layernorm.weight", (C,), 1.0)
            if MOE:
                normal(p + "block_sparse_moe.gate.weight", (E, C), 0.2)  # routes that differ by token
                for e in range(E):
                    q = p + f"block_sparse_moe.experts.{e}."
                    normal(q + "w1.weight", (FF, C))
                    normal(q + "w3.weight", (FF, C))
                    normal(q + "w2.weight", (C, FF))
                continue
            normal(p + "mlp.gate_proj.weight", (FF, C))
            normal(p + "mlp.up_proj.weight", (FF, C))
            normal(p + "mlp.down_proj.weight", (C, FF))
        near("model.norm.weight", (C,), 1.0)
        normal("lm_head.weight", (V, C))
    return {k: v.float().contiguous() for k, v in P.items()}


def attention(q, k, v):  # q [B,H,T,D], k v [B,KV,T,D]
    k = k.repeat_interleave(H // KV, dim=1)
    v = v.repeat_interleave(H // KV, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    s = s.masked_fill(~mask, float("-inf"))
    return F.softmax(s, dim=-1) @ v


def rope(x):  # Hugging Face rotate-half, x [B,heads,T,D]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D))
    freqs = torch.outer(torch.arange(T).float(), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()


def rmsnorm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def moe(P, p, h):  # Mixtral's sparse block over the tokens of h [Bn,T,C]; returns (out, aux)
    x = h.reshape(-1, C)
    probs = F.softmax(x @ P[p + "block_sparse_moe.gate.weight"].t(), dim=-1)
    w, sel = probs.topk(K, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for e in range(E):
        tok, j = (sel == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        q = p + f"block_sparse_moe.experts.{e}."
        xe = x[tok]
        ye = (F.silu(xe @ P[q + "w1.weight"].t()) * (xe @ P[q + "w3.weight"].t())) @ P[q + "w2.weight"].t()
        out = out.index_add(0, tok, ye * w[tok, j].unsqueeze(-1))
    f = torch.bincount(sel.reshape(-1), minlength=E).float() / sel.numel()  # no gradient: through P only
    return out.view_as(h), E * (f * probs.mean(0)).sum()


def forward(P, idx, tgt):
    Bn = idx.shape[0]
    auxes = []
    if ARCH == "gpt2":
        x = P["transformer.wte.weight"][idx] + P["transformer.wpe.weight"][:T]
        for i in range(L):
            p = f"transformer.h.{i}."
            h = F.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], 1e-5)
            qkv = h @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]
            q, k, v = qkv.split(C, dim=-1)
            q, k, v = (t.view(Bn, T, H, D).transpose(1, 2) for t in (q, k, v))
            y = attention(q, k, v).transpose(1, 2).reshape(Bn, T, C)
            x = x + y @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"]
            h = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], 1e-5)
            h = F.gelu(h @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"], approximate="tanh")
            x = x + h @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"]
        x = F.layer_norm(x, (C,), P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], 1e-5)
        logits = x @ P["transformer.wte.weight"].t()
    else:
        x = P["model.embed_tokens.weight"][idx]
        for i in range(L):
            p = f"model.layers.{i}."
            h = rmsnorm(x, P[p + "input_layernorm.weight"])
            q = (h @ P[p + "self_attn.q_proj.weight"].t()).view(Bn, T, H, D).transpose(1, 2)
            k = (h @ P[p + "self_attn.k_proj.weight"].t()).view(Bn, T, KV, D).transpose(1, 2)
            v = (h @ P[p + "self_attn.v_proj.weight"].t()).view(Bn, T, KV, D).transpose(1, 2)
            y = attention(rope(q), rope(k), v).transpose(1, 2).reshape(Bn, T, C)
            x = x + y @ P[p + "self_attn.o_proj.weight"].t()
            h = rmsnorm(x, P[p + "post_attention_layernorm.weight"])
            if MOE:
                y, a = moe(P, p, h)
                x = x + y
                auxes.append(a)
                continue
            h = F.silu(h @ P[p + "mlp.gate_proj.weight"].t()) * (h @ P[p + "mlp.up_proj.weight"].t())
            x = x + h @ P[p + "mlp.down_proj.weight"].t()
        x = rmsnorm(x, P["model.norm.weight"])
        logits = x @ P["lm_head.weight"].t()
    ce = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))
    aux = torch.stack(auxes).mean() if auxes else torch.zeros(())
    return ce, aux


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        b = t.detach().contiguous().float().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_shard(path, tokens):
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes() + np.asarray(tokens, dtype="<u2").tobytes())


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(2)
    # A token stream with structure: a noisy walk, so the loss has something to learn.
    tokens = np.cumsum(rng.integers(-2, 3, size=STEPS * G * T + 1)) % V
    write_shard(os.path.join(OUT, "tokens.bin"), tokens)
    P = init_params()
    write_safetensors(os.path.join(OUT, "init.safetensors"), P)
    for t in P.values():
        t.requires_grad_(True)
    decay = [t for t in P.values() if t.dim() >= 2]
    no_decay = [t for t in P.values() if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": HP["wd"]}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=HP["lr"], betas=(HP["b1"], HP["b2"]), eps=HP["eps"], foreach=False)
    data = torch.from_numpy(tokens.astype(np.int64))
    losses, norms, aux_losses = [], [], []
    for step in range(STEPS):
        opt.zero_grad()
        total, total_aux = 0.0, 0.0
        for micro in range(G // B):
            seqs = [step * G + micro * B + b for b in range(B)]
            idx = torch.stack([data[k * T: k * T + T] for k in seqs])
            tgt = torch.stack([data[k * T + 1: k * T + T + 1] for k in seqs])
            ce, aux = forward(P, idx, tgt)
            ((ce + AUX * aux) / (G // B)).backward()
            total += ce.item() / (G // B)
            total_aux += aux.item() / (G // B)
        aux_losses.append(total_aux)
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(P.values()), HP["clip"])))
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.step()
        losses.append(total)
    write_safetensors(os.path.join(OUT, "final.safetensors"), P)
    with open(os.path.join(OUT, "losses.json"), "w") as f:
        out = {"losses": losses, "grad_norms": norms, "torch": torch.__version__}
        if MOE:
            out["aux_losses"] = aux_losses
        json.dump(out, f, indent=1)
    kv = f"n_kv_head = {KV}\nd_ff = {FF}\n" if ARCH != "gpt2" else ""
    moe_keys = f"[model.moe]\nnum_experts = {E}\ntop_k = {K}\naux_loss_coef = {AUX}\n" if MOE else ""
    with open(os.path.join(OUT, "config.toml"), "w") as f:
        f.write(f"""# Written by tests/reference/torch_reference.py; the parity test points data.path and init.from here.
[model]
arch = "{"llama" if MOE else ARCH}"
n_layer = {L}
d_model = {C}
n_head = {H}
{kv}vocab_size = {V}
seq_len = {T}
tie_embeddings = {"true" if TIE else "false"}
{moe_keys}[train]
micro_batch = {B}
global_batch = {G}
steps = {STEPS}
lr = {HP["lr"]}
min_lr = {HP["min_lr"]}
warmup_steps = {HP["warmup"]}
schedule = "cosine"
weight_decay = {HP["wd"]}
beta1 = {HP["b1"]}
beta2 = {HP["b2"]}
eps = {HP["eps"]}
grad_clip = {HP["clip"]}
threads = 1
[data]
source = "tokens"
path = "tokens.bin"
val_path = "tokens.bin"
val_batches = 0
[init]
from = "init.safetensors"
""")
    print(ARCH, "losses", " ".join(f"{l:.6f}" for l in losses), "norms", " ".join(f"{n:.3f}" for n in norms))


if __name__ == "__main__":
    main()
