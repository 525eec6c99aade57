"""Grouped-query F.scaled_dot_product_attention(..., enable_gqa=True) references for
tests/unit/test_flash_attention.c (ct_flash_attention with k, v of fewer heads than q).

    build/venv-bench/bin/python tests/torch/gen_sdpa_gqa.py    # PyTorch >= 2.5 (enable_gqa)

Writes tests/fixtures/ops/sdpa_gqa.safetensors with the layout of gen_sdpa.py: for each case c,
c.q [B, H, Tq, D], c.k [B, KV, Tk, D], c.v [B, KV, Tk, Dv], the seed gradient c.g, c.y and
c.dq, c.dk, c.dv after y.backward(g) (float32); c.shape holds (B, H, KV, Tq, Tk, D, Dv, causal).
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import st  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ops")
CASES = [  # B, H, KV, Tq, Tk, D, Dv, causal
    (1, 4, 2, 130, 130, 32, 32, True),   # the Llama's group of 4 over 2 heads, tiles 64 x 64 / 128
    (2, 6, 2, 70, 70, 16, 16, True),
    (1, 4, 1, 50, 90, 8, 24, False),     # one key/value head for all (multi-query)
]


def main():
    torch.manual_seed(11)
    out = {}
    for c, (B, H, KV, Tq, Tk, D, Dv, causal) in enumerate(CASES):
        q = (torch.randn(B, H, Tq, D) * 1.5).requires_grad_()
        k = (torch.randn(B, KV, Tk, D) * 1.5).requires_grad_()
        v = torch.randn(B, KV, Tk, Dv).requires_grad_()
        g = torch.randn(B, H, Tq, Dv)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        y.backward(g)
        p = "%d." % c
        out[p + "shape"] = torch.tensor([B, H, KV, Tq, Tk, D, Dv, int(causal)], dtype=torch.int64)
        for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("y", y), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
            out[p + name] = t.detach().contiguous()
    st.save(os.path.join(ROOT, "sdpa_gqa.safetensors"), out,
            metadata={"torch": torch.__version__, "cases": str(len(CASES))})


if __name__ == "__main__":
    main()
