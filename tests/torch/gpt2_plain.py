"""GPT-2 in plain PyTorch (no `transformers`), reading a Hugging Face GPT2LMHeadModel
checkpoint: Conv1D weights [in, out], tied lm_head, GELU from config.json's
activation_function ("gelu_new" = tanh approximation). Used to check ctrain's
`--export hf` where `transformers` is not installed (CI).

    python3 tests/torch/gpt2_plain.py DIR LOGITS.safetensors   # DIR: model.safetensors + config.json
compares the model's logits on LOGITS' input_ids with LOGITS' logits (ctrain's, from
`ctrain generate --logits`) and exits non-zero above 1e-5 (relative to the largest logit)."""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import st  # noqa: E402


def gelu(x, tanh):
    if tanh:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))
    return F.gelu(x)


def forward(w, cfg, ids):
    n_layer, n_head = cfg["n_layer"], cfg["n_head"]
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    tanh = cfg.get("activation_function", "gelu_new") in ("gelu_new", "gelu_pytorch_tanh")
    p = lambda k: w["transformer." + k] if "transformer." + k in w else w[k]  # noqa: E731
    B, T = ids.shape
    x = p("wte.weight")[ids] + p("wpe.weight")[torch.arange(T)]
    C = x.shape[-1]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(n_layer):
        h = lambda k: p(f"h.{l}.{k}")  # noqa: E731
        a = F.layer_norm(x, (C,), h("ln_1.weight"), h("ln_1.bias"), eps)
        qkv = a @ h("attn.c_attn.weight") + h("attn.c_attn.bias")  # Conv1D: x @ W[in, out]
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(C // n_head)
        s = s.masked_fill(~mask, float("-inf"))
        y = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + (y @ h("attn.c_proj.weight") + h("attn.c_proj.bias"))
        m = F.layer_norm(x, (C,), h("ln_2.weight"), h("ln_2.bias"), eps)
        m = gelu(m @ h("mlp.c_fc.weight") + h("mlp.c_fc.bias"), tanh)
        x = x + (m @ h("mlp.c_proj.weight") + h("mlp.c_proj.bias"))
    x = F.layer_norm(x, (C,), p("ln_f.weight"), p("ln_f.bias"), eps)
    head = w["lm_head.weight"] if "lm_head.weight" in w else p("wte.weight")
    return x @ head.t()


def main():
    d, ref = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(d, "config.json")))
    w = {k: v.float() for k, v in st.load(os.path.join(d, "model.safetensors")).items()}
    r = st.load(ref)
    with torch.no_grad():
        logits = forward(w, cfg, r["input_ids"].long())
    want = r["logits"].float()
    assert logits.shape == want.shape, (logits.shape, want.shape)
    err = ((logits - want).abs().max() / want.abs().max()).item()
    print(f"plain PyTorch GPT-2 on the export: logits [{', '.join(map(str, want.shape))}], "
          f"max error {err:.2e} of the largest logit")
    sys.exit(0 if err <= 1e-5 else 1)


if __name__ == "__main__":
    main()
