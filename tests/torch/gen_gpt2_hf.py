"""A tiny GPT-2 made by Hugging Face `transformers`, for ctrain's GPT-2 import, export and
generation tests (tests/unit/test_gpt2_hf.c, tests/scripts/gpt2_hf.sh).

    python tests/torch/gen_gpt2_hf.py                 # writes tests/fixtures/models/gpt2_hf/
    python tests/torch/gen_gpt2_hf.py check DIR REF   # a ctrain export in DIR against ctrain's
                                                      # logits in REF (see gpt2_hf.sh)

Needs torch and transformers (PyPI, in a virtual environment): it only makes the fixture;
the tests read the committed files without Python.

Fixture: model.safetensors and config.json exactly as save_pretrained writes them (random
weights, 2 layers, width 64, 4 heads, 256 tokens, 64 positions, gelu_new), and
expected.safetensors: "input_ids" [2, 16] with "logits" [2, 16, 256] from the model, and
"prompt" [8] with "greedy" [24], the greedy continuation (argmax at each step, full forward).
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "models", "gpt2_hf")


def greedy(model, prompt, n):
    ids = prompt.clone()[None]
    margins = []
    for _ in range(n):
        logits = model(ids).logits[0, -1]
        top = torch.topk(logits, 2).values
        margins.append(float(top[0] - top[1]))
        ids = torch.cat([ids, logits.argmax()[None, None]], dim=1)
    return ids[0, len(prompt):], min(margins)


def make():
    torch.manual_seed(0)
    # initializer_range 0.2 (GPT-2's is 0.02): larger logits, so greedy picks are far from ties
    cfg = GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4, activation_function="gelu_new",
                     initializer_range=0.2, layer_norm_epsilon=1e-5, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0,
                     bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # non-trivial LayerNorm parameters and biases, which init leaves at 1 and 0
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT, safe_serialization=True)
    gen_cfg = os.path.join(OUT, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)  # not part of the model
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, 256, (2, 16), generator=g)
    prompt = torch.tensor(list(b"Hello, GPT"), dtype=torch.int64)
    with torch.no_grad():
        logits = model(input_ids).logits
        tokens, margin = greedy(model, prompt, 24)
    save_file({"input_ids": input_ids.to(torch.int64), "logits": logits.float().contiguous(), "prompt": prompt,
               "greedy": tokens.to(torch.int64).contiguous()}, os.path.join(OUT, "expected.safetensors"),
              metadata={"format": "pt"})
    print(f"wrote {OUT}: greedy {tokens.tolist()} (smallest top-1/top-2 logit gap {margin:.4f})")


def check(d, ref):
    """ctrain's export in d loads in transformers (from_pretrained, and load_state_dict
    strict=True into a fresh GPT2LMHeadModel) and gives ctrain's logits."""
    r = load_file(ref)
    model = GPT2LMHeadModel.from_pretrained(d, attn_implementation="eager").eval()
    sd = load_file(os.path.join(d, "model.safetensors"))
    fresh = GPT2LMHeadModel(GPT2Config.from_pretrained(d)).eval()
    missing, unexpected = fresh.load_state_dict(sd, strict=True)
    worst = 0.0
    with torch.no_grad():
        for m in (model, fresh):
            got = m(r["input_ids"].long()).logits
            err = ((got - r["logits"]).abs().max() / r["logits"].abs().max()).item()
            worst = max(worst, err)
    ok = worst <= 1e-4
    print(f"{'ok' if ok else 'FAIL'}: transformers' logits vs ctrain's: max error {worst:.3g} relative to the largest logit")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2], sys.argv[3]))
    make()
