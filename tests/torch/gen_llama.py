"""Reference Llama for ctrain's llama kind (tests/unit/test_llama.c).

    /usr/bin/python3 tests/torch/gen_llama.py      # writes tests/fixtures/models/llama_*.safetensors

A hand-written LlamaForCausalLM that follows transformers' modeling_llama.py step by step
(LlamaRMSNorm in f32, rotary embedding with rotate_half and inv_freq from rope_theta,
repeat_kv for grouped-query attention, causal softmax(q k^T / sqrt(d)) v, SwiGLU MLP, tied or
untied head), so that only torch is needed (Debian's python3-torch). Per config NAME:

  llama_NAME.weights.safetensors  the state_dict under Hugging Face's names (lm_head.weight
                                  too when tied, as LlamaForCausalLM's state_dict lists it)
  llama_NAME.ref.safetensors      "input_ids", "labels" [B, T] (next-token targets, a few
                                  -100), "logits" [B, T, V], "loss" [], "grad.<name>" for
                                  every parameter; metadata: the config
  llama_hf_NAME/                  the same model as transformers' save_pretrained lays it out:
                                  config.json (LlamaConfig's fields) and model.safetensors
                                  (a tied lm_head.weight left out, as save_pretrained does),
                                  plus expected.safetensors: "input_ids", "logits" of the
                                  weights as stored (gqa: in BF16, its logits from the
                                  BF16-rounded weights)
"""
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import st

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "models")


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.to(torch.float32)
        var = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + self.eps)
        return self.weight * x.to(dt)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_cos_sin(d, theta, T):
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    pos = torch.arange(T, dtype=torch.int64).float()
    freqs = (inv_freq[:, None] @ pos[None, :]).transpose(0, 1)  # [T, d/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def repeat_kv(x, n_rep):
    b, h, t, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        C, H, KV = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.d = C // H
        self.q_proj = nn.Linear(C, H * self.d, bias=False)
        self.k_proj = nn.Linear(C, KV * self.d, bias=False)
        self.v_proj = nn.Linear(C, KV * self.d, bias=False)
        self.o_proj = nn.Linear(H * self.d, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        H, KV, d = self.c["num_attention_heads"], self.c["num_key_value_heads"], self.d
        q = self.q_proj(x).view(B, T, H, d).transpose(1, 2)
        k = self.k_proj(x).view(B, T, KV, d).transpose(1, 2)
        v = self.v_proj(x).view(B, T, KV, d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, H // KV), repeat_kv(v, H // KV)
        s = (q @ k.transpose(2, 3)) / math.sqrt(d)
        mask = torch.full((T, T), float("-inf")).triu(1)
        p = F.softmax(s + mask, dim=-1, dtype=torch.float32)
        y = (p @ v).transpose(1, 2).reshape(B, T, H * d)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        C, I = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(C, I, bias=False)
        self.up_proj = nn.Linear(C, I, bias=False)
        self.down_proj = nn.Linear(I, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class LlamaForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Model(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        if c["tie_word_embeddings"]:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, ids):
        c = self.c
        T = ids.shape[1]
        cos, sin = rope_cos_sin(c["hidden_size"] // c["num_attention_heads"], c["rope_theta"], T)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))


BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-6, rope_theta=10000.0,
            tie_word_embeddings=False)
CONFIGS = {
    "gqa": dict(BASE),
    "tied": dict(BASE, tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=500000.0),
    "mha": dict(BASE, num_key_value_heads=4),
}


def make(name, c, seed):
    torch.manual_seed(seed)
    m = LlamaForCausalLM(c)
    with torch.no_grad():  # N(0, 0.1) weights; RMSNorm weights near 1 but not 1
        for pn, p in m.named_parameters():
            if pn.endswith("layernorm.weight") or pn == "model.norm.weight":
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.1)
    B, T = 2, 16
    ids = torch.randint(0, c["vocab_size"], (B, T))
    labels = torch.randint(0, c["vocab_size"], (B, T))
    labels[0, 3] = labels[1, 10] = -100
    logits = m(ids)
    loss = F.cross_entropy(logits.reshape(-1, c["vocab_size"]), labels.reshape(-1), ignore_index=-100)
    loss.backward()
    sd = {k: v.detach().clone() for k, v in m.state_dict().items()}
    meta = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in c.items()}
    st.save(os.path.join(OUT, f"llama_{name}.weights.safetensors"), sd, metadata={"format": "pt"})
    ref = {"input_ids": ids, "labels": labels, "logits": logits.detach(), "loss": loss.detach()}
    for pn, p in m.named_parameters():  # a tied weight once, under embed_tokens
        ref["grad." + pn] = p.grad.detach().clone()
    st.save(os.path.join(OUT, f"llama_{name}.ref.safetensors"), ref, metadata=meta)
    print(f"llama_{name}: loss {loss.item():.6f}, {len(sd)} tensors")
    return m, ids


def save_hf(name, c, m, ids, dtype):
    """m as save_pretrained writes it, in dtype; expected logits from those weights"""
    d = os.path.join(OUT, f"llama_hf_{name}")
    os.makedirs(d, exist_ok=True)
    sd = {k: v.detach().to(dtype).clone() for k, v in m.state_dict().items()}
    if c["tie_word_embeddings"]:
        del sd["lm_head.weight"]
    st.save(os.path.join(d, "model.safetensors"), sd, metadata={"format": "pt"})
    with torch.no_grad():
        for pn, p in m.named_parameters():
            p.copy_(p.to(dtype).float())
        logits = m(ids)
    st.save(os.path.join(d, "expected.safetensors"), {"input_ids": ids, "logits": logits}, metadata={"format": "pt"})
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu", attention_bias=False,
               attention_dropout=0.0, mlp_bias=False, rope_scaling=None, initializer_range=0.02, pretraining_tp=1,
               use_cache=True, bos_token_id=1, eos_token_id=2, torch_dtype=str(dtype).replace("torch.", ""),
               transformers_version="4.40.0", **c)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    HF = {"tied": torch.float32, "gqa": torch.bfloat16}
    for i, (name, c) in enumerate(CONFIGS.items()):
        m, ids = make(name, c, 1000 + i)
        if name in HF:
            save_hf(name, c, m, ids, HF[name])
