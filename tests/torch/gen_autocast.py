"""PyTorch autocast references for tests/unit/test_autocast.c (ctrain's ct_autocast_begin).

    /tmp/gpt2-venv/bin/python tests/torch/gen_autocast.py    # a PyTorch with CPU autocast (2.x)

Reuses the models and batches of gen_models.py (tests/fixtures/models/model_KIND.*), so
only the results are stored: per KIND (mlp, cnn, gpt) and DT (bf16; f16 for the mlp),
tests/fixtures/models/autocast_KIND_DT.ref.safetensors holds, from
    with torch.autocast("cpu", dtype=DT): out = model(input); loss = loss_fn(out, target)
    loss.backward()
output (in the dtype autocast gave it: DT), loss (f32), grad.<param> (f32: master weights).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import st  # noqa: E402
from gen_models import ROOT, build, config_from_tensor, gpt_loss  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def case(kind, dt, suffix):
    ref, _ = st.load_with_metadata(os.path.join(ROOT, "model_%s.ref.safetensors" % kind))
    sd = st.load(os.path.join(ROOT, "model_%s.weights.safetensors" % kind))
    model = build(kind, config_from_tensor(kind, ref["config"]))
    model.load_state_dict(sd, strict=True)
    model.train()
    loss_fn = gpt_loss if kind == "gpt" else F.cross_entropy
    with torch.autocast("cpu", dtype=dt):
        out = model(ref["input"])
        loss = loss_fn(out, ref["target"])
    assert out.dtype == dt and loss.dtype == torch.float32, (out.dtype, loss.dtype)
    loss.backward()
    res = {"output": out, "loss": loss.reshape(1)}
    for pn, p in model.named_parameters():
        assert p.grad.dtype == torch.float32
        res["grad." + pn] = p.grad
    path = os.path.join(ROOT, "autocast_%s_%s.ref.safetensors" % (kind, suffix))
    st.save(path, {k: v.detach().contiguous() for k, v in res.items()}, metadata={"format": "pt"})
    print("  %s %s: loss %.5f (f32 %.5f)" % (kind, suffix, loss.item(), ref["loss"].item()))


if __name__ == "__main__":
    torch.manual_seed(0)
    for kind in ("mlp", "cnn", "gpt"):
        case(kind, torch.bfloat16, "bf16")
    case("mlp", torch.float16, "f16")
