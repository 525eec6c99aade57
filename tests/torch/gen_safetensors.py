"""Writes tests/fixtures/io/torch_written.safetensors: one small tensor per dtype with values
given by formulas that tests/unit/test_safetensors.c recomputes (run with /usr/bin/python3).

    /usr/bin/python3 tests/torch/gen_safetensors.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import st  # noqa: E402

root = os.path.join(os.path.dirname(__file__), "..", "fixtures", "io")
os.makedirs(root, exist_ok=True)

a = torch.arange(24, dtype=torch.float64)
tensors = {
    "f32": (a[:6] * 0.25 - 1).float().reshape(2, 3),             # i*0.25-1
    "f64": (a[:5] / 3).reshape(5),                                # i/3
    "f16": (a[:8] * 0.5 - 2).half().reshape(2, 2, 2),            # i*0.5-2 (exact in f16)
    "bf16": (a[:4] * 1.5 + 0.25).bfloat16().reshape(4, 1),        # i*1.5+0.25 (exact in bf16)
    "layer.0.weight": torch.arange(-12, 12, dtype=torch.float32).reshape(2, 3, 4) / 8,
    "i32": torch.arange(-3, 3, dtype=torch.int32) * 1000003,      # (i-3)*1000003
    "i64": torch.arange(3, dtype=torch.int64) * (1 << 40) - 7,   # i*2^40-7
    "u8": torch.arange(250, 256, dtype=torch.int64).to(torch.uint8),
    "i8": torch.arange(-128, -124, dtype=torch.int8),
    "mask": torch.tensor([True, False, True]),
    "scalar": torch.tensor(3.5, dtype=torch.float32),
    "empty": torch.zeros(0, 3, dtype=torch.float32),
}
path = os.path.join(root, "torch_written.safetensors")
st.save(path, tensors, metadata={"format": "pt", "source": "torch " + torch.__version__})
back = st.load(path)
for k, v in tensors.items():
    assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
print("wrote", os.path.normpath(path), os.path.getsize(path), "bytes")
