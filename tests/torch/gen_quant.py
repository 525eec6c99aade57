"""PyTorch references for dynamic int8 quantization (tests/unit/test_quant.c).

    python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch    # a PyTorch with fbgemm
    /tmp/tv/bin/python tests/torch/gen_quant.py    # writes tests/fixtures/quant/quant_fbgemm.safetensors
    /usr/bin/python3 tests/torch/gen_quant.py      # Debian's 1.13: quant_onednn.safetensors

The engine is the first of x86, fbgemm, onednn that the PyTorch running the script has:
a PyTorch from PyPI gives x86 (its dynamic Linear is fbgemm's), which ctrain matches to the
bit; Debian's python3-torch 1.13 has no fbgemm and gives onednn, kept to document how far
that one is (docs/quantization.md). Run the fbgemm one first: the onednn file holds only
the outputs, computed from the fbgemm file's inputs and weights (keeps the fixtures small).

Per Linear case NAME (shapes M x K -> N):
  NAME.x [M, K], NAME.w [N, K], NAME.b [N]   f32 inputs
  NAME.qw [N, K] I8, NAME.scale [1] or [N]    PyTorch's quantized weight (int_repr, scales)
  NAME.y [M, N]                               quantize_dynamic(Linear)(x)
  NAME.per_channel [1] I64                    1 when per_channel_dynamic_qconfig was used
MLP: mlp.<state_dict> (Linear 20-64-32-10), mlp.x [9, 20], mlp.y the quantized logits.
"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
import st  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "quant")
qd = torch.ao.quantization


def engine():
    for e in ("x86", "fbgemm", "onednn"):
        if e in torch.backends.quantized.supported_engines:
            return e
    sys.exit("no x86 quantized engine in this PyTorch")


def quantize(model, per_channel):
    qconfig = qd.per_channel_dynamic_qconfig if per_channel else qd.default_dynamic_qconfig
    return qd.quantize_dynamic(model, {nn.Linear: qconfig}, dtype=torch.qint8)


def linear_case(out, name, M, K, N, per_channel=False, shift=0.0, given=None):
    lin = nn.Linear(K, N)
    x = torch.randn(M, K) * 2 + shift
    if given:
        x = given[f"{name}.x"]
        with torch.no_grad():
            lin.weight.copy_(given[f"{name}.w"])
            lin.bias.copy_(given[f"{name}.b"])
    q = quantize(nn.Sequential(lin), per_channel)[0]
    wq = q.weight()
    with torch.no_grad():
        y = q(x)
    out.update({f"{name}.x": x, f"{name}.w": lin.weight.detach(), f"{name}.b": lin.bias.detach(),
                f"{name}.qw": wq.int_repr(), f"{name}.y": y,
                f"{name}.per_channel": torch.tensor([int(per_channel)], dtype=torch.int64)})
    if per_channel:
        out[f"{name}.scale"] = wq.q_per_channel_scales().float()
    else:
        out[f"{name}.scale"] = torch.tensor([wq.q_scale()], dtype=torch.float32)


def main():
    eng = engine()
    torch.backends.quantized.engine = eng
    torch.manual_seed(0)
    given = None
    if eng == "onednn":
        given = st.load(os.path.join(ROOT, "quant_fbgemm.safetensors"))
    out = {}
    for M, K, N in ((1, 20, 100), (7, 100, 257), (33, 257, 20)):
        linear_case(out, f"lin_{M}_{K}_{N}", M, K, N, given=given)
    linear_case(out, "pc_7_20_100", 7, 20, 100, per_channel=True, given=given)
    linear_case(out, "pos_33_100_20", 33, 100, 20, shift=3.0, given=given)  # all positive: zero point 0
    linear_case(out, "neg_7_20_100", 7, 20, 100, shift=-5.0, given=given)   # all negative: zero point 127
    mlp = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    x = torch.randn(9, 20)
    if given:
        mlp.load_state_dict({k[4:]: v for k, v in given.items() if k.startswith("mlp.") and k[4:] not in ("x", "y")})
        x = given["mlp.x"]
    for k, v in mlp.state_dict().items():
        out[f"mlp.{k}"] = v
    with torch.no_grad():
        out["mlp.y"] = quantize(mlp, False)(x)
    out["mlp.x"] = x
    if given:  # the inputs are the fbgemm file's
        out = {k: v for k, v in out.items() if k.endswith(".y")}
    os.makedirs(ROOT, exist_ok=True)
    path = os.path.join(ROOT, f"quant_{'onednn' if eng == 'onednn' else 'fbgemm'}.safetensors")
    st.save(path, {k: v.contiguous() for k, v in out.items()},
            metadata={"engine": eng, "torch": torch.__version__})
    print(f"wrote {path} (engine {eng}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
