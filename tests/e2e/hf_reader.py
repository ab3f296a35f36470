#!/usr/bin/env python3
"""Reads a Hugging Face model directory as transformers would (config.json, model.safetensors
with metadata format "pt") with nothing of loom's, runs the model's forward in plain Python
(GPT2LMHeadModel: Conv1D weights [in, out], gelu_new; LlamaForCausalLM: RMSNorm, rotate-half
RoPE, GQA, SiLU-gated MLP) and prints the mean next-token loss over a token file's first
SEQS sequences of T tokens (sequence k: tokens k*T .. k*T+T).

    hf_reader.py DIR TOKENS.txt SEQS T
TOKENS.txt holds the text whose bytes are the tokens (the byte tokenizer).
"""
import json
import math
import struct
import sys


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
    meta = header.pop("__metadata__", {})
    if meta.get("format") != "pt":
        sys.exit(f"{path}: metadata format is {meta.get('format')!r}; transformers needs 'pt'")
    out = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            sys.exit(f"{name}: dtype {t['dtype']}")
        a, b = t["data_offsets"]
        flat = struct.unpack(f"<{(b - a) // 4}f", body[a:b])
        shape = t["shape"]
        out[name] = (shape, list(flat))
    return out


def matrix(t):
    shape, flat = t
    rows, cols = shape
    return [flat[r * cols:(r + 1) * cols] for r in range(rows)]


def matmul(x, w):  # x [n, k] @ w [k, m]
    wt = list(zip(*w))
    return [[sum(a * b for a, b in zip(row, col)) for col in wt] for row in x]


def linear_t(x, w):  # x @ w.T, w [out, in] (nn.Linear)
    return [[sum(a * b for a, b in zip(row, wr)) for wr in w] for row in x]


def add_bias(x, b):
    return [[v + c for v, c in zip(row, b)] for row in x]


def layer_norm(x, w, b, eps):
    out = []
    for row in x:
        mu = sum(row) / len(row)
        var = sum((v - mu) ** 2 for v in row) / len(row)
        r = 1.0 / math.sqrt(var + eps)
        out.append([(v - mu) * r * g + c for v, g, c in zip(row, w, b)])
    return out


def rms_norm(x, w, eps):
    out = []
    for row in x:
        r = 1.0 / math.sqrt(sum(v * v for v in row) / len(row) + eps)
        out.append([v * r * g for v, g in zip(row, w)])
    return out


def gelu_new(v):
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))


def silu(v):
    return v / (1.0 + math.exp(-v))


def attention(q, k, v, n_head, n_kv, d):  # rows are positions; causal
    T = len(q)
    out = [[0.0] * (n_head * d) for _ in range(T)]
    group = n_head // n_kv
    for h in range(n_head):
        kh = h // group
        for i in range(T):
            qi = q[i][h * d:(h + 1) * d]
            s = [sum(a * b for a, b in zip(qi, k[j][kh * d:(kh + 1) * d])) / math.sqrt(d) for j in range(i + 1)]
            m = max(s)
            e = [math.exp(x - m) for x in s]
            z = sum(e)
            for j in range(i + 1):
                p = e[j] / z
                vj = v[j][kh * d:(kh + 1) * d]
                for c in range(d):
                    out[i][h * d + c] += p * vj[c]
    return out


def rope(x, n, d, theta):  # rotate-half, per head
    out = []
    for pos, row in enumerate(x):
        r = list(row)
        for h in range(n):
            base = h * d
            for i in range(d // 2):
                f = pos / theta ** (2 * i / d)
                c, s = math.cos(f), math.sin(f)
                a, b = row[base + i], row[base + i + d // 2]
                r[base + i] = a * c - b * s
                r[base + i + d // 2] = b * c + a * s
        out.append(r)
    return out


def gpt2_logits(cfg, w, ids):
    C, H, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    eps = cfg["layer_norm_epsilon"]
    assert cfg["activation_function"] == "gelu_new"
    p = "transformer."
    wte, wpe = matrix(w[p + "wte.weight"]), matrix(w[p + "wpe.weight"])
    x = [[a + b for a, b in zip(wte[t], wpe[i])] for i, t in enumerate(ids)]
    for l in range(L):
        q = f"{p}h.{l}."
        h = layer_norm(x, w[q + "ln_1.weight"][1], w[q + "ln_1.bias"][1], eps)
        qkv = add_bias(matmul(h, matrix(w[q + "attn.c_attn.weight"])), w[q + "attn.c_attn.bias"][1])
        a = attention([r[:C] for r in qkv], [r[C:2 * C] for r in qkv], [r[2 * C:] for r in qkv], H, H, C // H)
        a = add_bias(matmul(a, matrix(w[q + "attn.c_proj.weight"])), w[q + "attn.c_proj.bias"][1])
        x = [[u + v for u, v in zip(r, s)] for r, s in zip(x, a)]
        h = layer_norm(x, w[q + "ln_2.weight"][1], w[q + "ln_2.bias"][1], eps)
        f = add_bias(matmul(h, matrix(w[q + "mlp.c_fc.weight"])), w[q + "mlp.c_fc.bias"][1])
        f = [[gelu_new(v) for v in r] for r in f]
        f = add_bias(matmul(f, matrix(w[q + "mlp.c_proj.weight"])), w[q + "mlp.c_proj.bias"][1])
        x = [[u + v for u, v in zip(r, s)] for r, s in zip(x, f)]
    x = layer_norm(x, w[p + "ln_f.weight"][1], w[p + "ln_f.bias"][1], eps)
    head = wte if cfg.get("tie_word_embeddings", True) else matrix(w["lm_head.weight"])
    return linear_t(x, head)


def llama_logits(cfg, w, ids):
    C, H, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    KV = cfg.get("num_key_value_heads", H)
    d, eps, theta = C // H, cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    assert cfg["hidden_act"] == "silu"
    emb = matrix(w["model.embed_tokens.weight"])
    x = [list(emb[t]) for t in ids]
    for l in range(L):
        q = f"model.layers.{l}."
        h = rms_norm(x, w[q + "input_layernorm.weight"][1], eps)
        qs = rope(linear_t(h, matrix(w[q + "self_attn.q_proj.weight"])), H, d, theta)
        ks = rope(linear_t(h, matrix(w[q + "self_attn.k_proj.weight"])), KV, d, theta)
        vs = linear_t(h, matrix(w[q + "self_attn.v_proj.weight"]))
        a = linear_t(attention(qs, ks, vs, H, KV, d), matrix(w[q + "self_attn.o_proj.weight"]))
        x = [[u + v for u, v in zip(r, s)] for r, s in zip(x, a)]
        h = rms_norm(x, w[q + "post_attention_layernorm.weight"][1], eps)
        g = linear_t(h, matrix(w[q + "mlp.gate_proj.weight"]))
        u = linear_t(h, matrix(w[q + "mlp.up_proj.weight"]))
        f = [[silu(a) * b for a, b in zip(r, s)] for r, s in zip(g, u)]
        f = linear_t(f, matrix(w[q + "mlp.down_proj.weight"]))
        x = [[a + b for a, b in zip(r, s)] for r, s in zip(x, f)]
    x = rms_norm(x, w["model.norm.weight"][1], eps)
    head = emb if cfg.get("tie_word_embeddings", False) else matrix(w["lm_head.weight"])
    return linear_t(x, head)


def main():
    d, text, seqs, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    cfg = json.load(open(f"{d}/config.json"))
    w = read_safetensors(f"{d}/model.safetensors")
    arch = cfg["architectures"][0]
    forward = {"GPT2LMHeadModel": gpt2_logits, "LlamaForCausalLM": llama_logits}[arch]
    tokens = list(open(text, "rb").read())
    total, n = 0.0, 0
    for k in range(seqs):
        seq = tokens[k * T:k * T + T + 1]
        logits = forward(cfg, w, seq[:-1])
        for row, target in zip(logits, seq[1:]):
            m = max(row)
            total += m + math.log(sum(math.exp(v - m) for v in row)) - row[target]
            n += 1
    print(f"{arch} loss {total / n:.6f}")


if __name__ == "__main__":
    main()
