"""bf16 F.scaled_dot_product_attention references for tests/unit/test_flash_qkv.c.

    /tmp/gpt2-venv/bin/python tests/torch/gen_sdpa_bf16.py    # PyTorch >= 2 (1.13 has no SDPA)

Writes tests/fixtures/ops/sdpa_qkv_bf16.safetensors: for each case c a packed c.qkv [B, T, 3C]
(bf16 values, stored as f32) split into heads as the GPT does, the seed gradient c.g (bf16
values), and from y = F.scaled_dot_product_attention(q, k, v, is_causal=...) on bf16 q, k, v
(PyTorch's CPU flash attention for bf16) c.y [B, T, C] and c.dqkv after y.backward(g), both
bf16 stored as f32; c.y64, c.dqkv64 the same in float64. c.shape: (B, T, H, D, causal).
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import st  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ops")
CASES = [  # B, T, H, D, causal
    (2, 67, 2, 32, True),
    (1, 130, 3, 64, False),
    (1, 256, 2, 32, True),  # the GPT bench's T and head size
    (1, 70, 5, 24, False),
]


def attend(qkv, g, H, causal):
    B, T, C3 = qkv.shape
    C = C3 // 3
    qkv = qkv.detach().clone().requires_grad_()
    q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in qkv.split(C, dim=2))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2).reshape(B, T, C)
    y.backward(g)
    return y.detach(), qkv.grad


def main():
    torch.manual_seed(11)
    out = {}
    for c, (B, T, H, D, causal) in enumerate(CASES):
        qkv = (torch.randn(B, T, 3 * H * D) * 1.5).bfloat16()
        g = torch.randn(B, T, H * D).bfloat16()
        y, dqkv = attend(qkv, g, H, causal)
        y64, dqkv64 = attend(qkv.double(), g.double(), H, causal)
        p = "%d." % c
        out[p + "shape"] = torch.tensor([B, T, H, D, int(causal)], dtype=torch.int64)
        for name, t in (("qkv", qkv), ("g", g), ("y", y), ("dqkv", dqkv), ("y64", y64), ("dqkv64", dqkv64)):
            out[p + name] = t.float().contiguous()
    st.save(os.path.join(ROOT, "sdpa_qkv_bf16.safetensors"), out,
            metadata={"torch": torch.__version__, "cases": str(len(CASES))})


if __name__ == "__main__":
    main()
