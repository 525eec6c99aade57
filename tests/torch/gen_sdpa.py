"""F.scaled_dot_product_attention references for tests/unit/test_flash_attention.c.

    /tmp/gpt2-venv/bin/python tests/torch/gen_sdpa.py    # PyTorch >= 2 (1.13 has no SDPA)

Writes tests/fixtures/ops/sdpa.safetensors: for each case c, inputs c.q, c.k, c.v, the seed
gradient c.g, and from y = F.scaled_dot_product_attention(q, k, v, is_causal=...) (float32,
PyTorch's CPU kernel of its choice, default scale 1/sqrt(D)), c.y and c.dq, c.dk, c.dv after
y.backward(g). c.shape holds (B, H, Tq, Tk, D, Dv, causal). Shapes sit around ctrain's tile
sizes (64 query rows x 128 keys) and the GPT's head sizes (32, 64).
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import st  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ops")
CASES = [  # B, H, Tq, Tk, D, Dv, causal
    (1, 1, 200, 200, 32, 32, True),
    (1, 1, 130, 130, 64, 64, True),
    (1, 3, 70, 150, 16, 24, False),
    (1, 1, 256, 256, 32, 32, True),
]


def main():
    torch.manual_seed(7)
    out = {}
    for c, (B, H, Tq, Tk, D, Dv, causal) in enumerate(CASES):
        q = (torch.randn(B, H, Tq, D) * 1.5).requires_grad_()
        k = (torch.randn(B, H, Tk, D) * 1.5).requires_grad_()
        v = torch.randn(B, H, Tk, Dv).requires_grad_()
        g = torch.randn(B, H, Tq, Dv)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        y.backward(g)
        p = "%d." % c
        out[p + "shape"] = torch.tensor([B, H, Tq, Tk, D, Dv, int(causal)], dtype=torch.int64)
        for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("y", y), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
            out[p + name] = t.detach().contiguous()
    st.save(os.path.join(ROOT, "sdpa.safetensors"), out,
            metadata={"torch": torch.__version__, "cases": str(len(CASES))})


if __name__ == "__main__":
    main()
