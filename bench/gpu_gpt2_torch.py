"""PyTorch's side of bench/gpu_gpt2.c: GPT-2 small (124M) training steps on cuda:0, eager
mode with scaled_dot_product_attention (no torch.compile), the same sizes, optimizer and
measurement (3 warm-up steps, median step with the loss read back each step).

    python3 bench/gpu_gpt2_torch.py [--amp bf16|none] [--matmul highest|high|medium]
                                    [--steps 20] [--batch 8] [--seq 1024] [--layers 12]

--amp bf16 is torch.autocast(dtype=bfloat16) with f32 master weights (no GradScaler needed
for bf16); --matmul is torch.set_float32_matmul_precision for the f32 GEMMs. One line:
    RESULT impl=pytorch ... tokens_per_s=... step_ms=... peak_alloc_mib=... reserved_mib=... mfu=...
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PEAK_BF16 = 989.4e12


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, d=768, h=12, V=50257, ctx=1024):
        super().__init__()
        self.wte = nn.Embedding(V, d)
        self.wpe = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(L))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2
        for name, mod in self.named_modules():  # GPT-2's initialisation, as ctrain's (nanoGPT's)
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                # the projections into the residual stream scaled by 1/sqrt(2 L), as ctrain does
                proj = name.endswith("c_proj") or name.endswith("mlp_proj")
                nn.init.normal_(mod.weight, 0.0, 0.02 / math.sqrt(2 * L) if proj else 0.02)
            if isinstance(mod, nn.Linear) and mod.bias is not None:
                nn.init.zeros_(mod.bias)

    def forward(self, idx, tgt):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--amp", default="bf16", choices=["bf16", "none"])
    ap.add_argument("--matmul", default="highest", choices=["highest", "high", "medium"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    a = ap.parse_args()
    torch.manual_seed(1337)
    torch.set_float32_matmul_precision(a.matmul)
    dev = torch.device("cuda", 0)
    m = GPT(a.layers).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=6e-4, weight_decay=0.1)
    n_params = sum(p.numel() for p in m.parameters())
    N = n_params - m.wpe.weight.numel()
    flops_tok = 6 * N + 12 * a.layers * a.seq * 768
    g = torch.Generator().manual_seed(0)
    tok = torch.randint(0, 50257, (a.batch, a.seq + 1), generator=g)
    x, y = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()
    warm, ms, first, last = 3, [], math.nan, math.nan
    for s in range(warm + a.steps):
        t0 = time.perf_counter()
        xd, yd = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.amp == "bf16"):
            loss = m(xd, yd)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        lv = loss.item()
        if s == 0:
            first = lv
            torch.cuda.reset_peak_memory_stats(dev)
        last = lv
        if s >= warm:
            ms.append(1e3 * (time.perf_counter() - t0))
    ms.sort()
    med = ms[len(ms) // 2]
    tps = a.batch * a.seq / (med * 1e-3)
    print(f"RESULT impl=pytorch-{torch.__version__} model=gpt2-124M batch={a.batch} seq={a.seq} layers={a.layers} "
          f"amp={a.amp} matmul={a.matmul} params={n_params} step_ms={med:.2f} min_ms={ms[0]:.2f} tokens_per_s={tps:.0f} "
          f"peak_alloc_mib={torch.cuda.max_memory_allocated(dev) / 2**20:.0f} "
          f"reserved_mib={torch.cuda.max_memory_reserved(dev) / 2**20:.0f} mfu={tps * flops_tok / PEAK_BF16:.3f} "
          f"loss_first={first:.4f} loss_last={last:.4f}", flush=True)


if __name__ == "__main__":
    main()
