"""transformers-made Llama references for ctrain (tests/unit/test_llama_transformers.c).

    /work/main/build/venv-bench/bin/python tests/torch/gen_llama_transformers.py

Needs the PyPI torch and transformers (no hub download: random models from configs). Writes,
per config NAME, tests/fixtures/models/llama_tf_NAME/ as LlamaForCausalLM.save_pretrained
lays it out (config.json, model.safetensors in F32; "sharded": model.safetensors.index.json
and its shards), plus ref.safetensors:

  input_ids [2, 16], logits [2, 16, V]       eval-mode forward (f32)
  inv_freq [D/2]                             the rotary embedding's inverse frequencies
  train_x, train_y [20, 4, 16]               20 batches, next-token targets (a few -100)
  loss_f32 [20], loss_bf16 [20]              the loss of each of 20 AdamW steps (lr 1e-4,
                                             torch's defaults otherwise) from these weights,
                                             in f32 and under torch.autocast("cpu", bf16)
  prompt [8], greedy [50]                    generate(do_sample=False) from the prompt

Configs: hidden 64, 2 layers, 4 query heads: "gqa" (2 key/value heads, tied head, plain
rotary positions), "llama3" (2 key/value heads, own head, rope_scaling llama3 with bands on
both sides of the blend), "sharded" (4 key/value heads, tied, llama3, vocab 384, written in
shards of at most 100 KB).
"""
import json
import os

import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

import st

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "models")
RS = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 32}
CONFIGS = {
    "gqa": dict(kv=2, tied=True, rs=None, vocab=256, shard=None),
    "llama3": dict(kv=2, tied=False, rs=RS, vocab=256, shard=None),
    "sharded": dict(kv=4, tied=True, rs=RS, vocab=384, shard="100KB"),
}


def build(c, seed):
    torch.manual_seed(seed)
    kw = dict(vocab_size=c["vocab"], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=c["kv"], max_position_embeddings=128,
              rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=c["tied"],
              bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if c["rs"]:
        kw["rope_scaling"] = dict(c["rs"])
    cfg = LlamaConfig(**kw)
    m = LlamaForCausalLM(cfg).float()
    # a trained-looking spread: the default init (std 0.02) makes near-uniform logits
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.1)
            else:
                p.uniform_(0.5, 1.5)
    return m.eval()


def losses(m0, state, xs, ys, bf16):
    m = type(m0)(m0.config).float()
    m.load_state_dict(state)
    m.train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    out = []
    for x, y in zip(xs, ys):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = m(input_ids=x).logits
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return torch.tensor(out, dtype=torch.float64)


def main():
    torch.set_num_threads(2)
    for i, (name, c) in enumerate(CONFIGS.items()):
        m = build(c, 100 + i)
        V = c["vocab"]
        d = os.path.join(OUT, "llama_tf_" + name)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            os.remove(os.path.join(d, f))
        kw = {"max_shard_size": c["shard"]} if c["shard"] else {}
        m.save_pretrained(d, safe_serialization=True, **kw)
        g = torch.Generator().manual_seed(7 + i)
        ids = torch.randint(0, V, (2, 16), generator=g)
        with torch.no_grad():
            logits = m(input_ids=ids).logits.float()
        xs = torch.randint(0, V, (20, 4, 17), generator=g)
        ys = xs[:, :, 1:].clone()
        xs = xs[:, :, :-1].contiguous()
        ys[:, :, -1][torch.rand(20, 4, generator=g) < 0.5] = -100
        state = {k: v.clone() for k, v in m.state_dict().items()}
        l32 = losses(m, state, xs, ys, False)
        l16 = losses(m, state, xs, ys, True)
        prompt = torch.randint(0, V, (1, 8), generator=g)
        with torch.no_grad():
            gen = m.generate(prompt, max_new_tokens=50, min_new_tokens=50, do_sample=False, pad_token_id=0)
        greedy = gen[0, 8:]
        assert greedy.numel() == 50
        inv = m.model.rotary_emb.inv_freq.float()
        st.save(os.path.join(d, "ref.safetensors"),
                {"input_ids": ids, "logits": logits, "inv_freq": inv, "train_x": xs, "train_y": ys,
                 "loss_f32": l32, "loss_bf16": l16, "prompt": prompt[0], "greedy": greedy},
                metadata={"format": "pt", "torch": torch.__version__, "transformers": transformers.__version__})
        print(name, sorted(os.listdir(d)), "loss f32", l32[0].item(), "->", l32[-1].item(),
              "bf16 max diff", (l16 - l32).abs().max().item())


if __name__ == "__main__":
    main()
