"""PyTorch side of the GPT memory-saver benchmark (bench/train_bench.c `single gpt ... VARIANT`):
the same GPT (6 layers, width 256, 8 heads, vocabulary 256), 2048 tokens a step, AdamW.

    PYTHON bench/torch_gpt_savers.py THREADS SECONDS VARIANT    # VARIANT: plain|flash|ckpt, ",T=N", ",amp=bf16"
flash: F.scaled_dot_product_attention(is_causal=True) (PyTorch >= 2); ckpt:
torch.utils.checkpoint per block (use_reentrant=False); amp=bf16: torch.autocast("cpu", bfloat16)
around forward and loss. One RESULT line in train_bench's format
(cpu_step_ms: process CPU time per step, what a loaded machine disturbs least).
"""
import math
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "torch"))
import gen_models as gm  # noqa: E402
from torch_train import sdpa_forward  # noqa: E402  (bench/ is this script's directory)


def main():
    threads, seconds = int(sys.argv[1]), float(sys.argv[2])
    variant = sys.argv[3].split(",") if len(sys.argv) > 3 else ["plain"]
    T = next((int(v[2:]) for v in variant if v.startswith("T=")), 256)
    torch.set_num_threads(threads)
    torch.manual_seed(1234)
    if "flash" in variant:
        gm.CausalSelfAttention.forward = sdpa_forward
    model = gm.GPT(n_layer=6, n_embd=256, n_head=8, block_size=T, vocab_size=256)
    if "ckpt" in variant:
        gpt_forward = gm.GPT.forward

        def ckpt_forward(self, idx):
            b, t = idx.size()
            x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(torch.arange(0, t)))
            for block in self.transformer.h:
                x = checkpoint(block, x, use_reentrant=False)
            return self.lm_head(self.transformer.ln_f(x))
        gm.GPT.forward = ckpt_forward
        del gpt_forward
    decay = [p for p in model.parameters() if p.dim() >= 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}], lr=3e-4,
                            betas=(0.9, 0.95))
    B = max(1, 2048 // T)
    g = torch.Generator().manual_seed(4321)
    batches = [(torch.randint(0, 256, (B, T), generator=g), torch.randint(0, 256, (B, T), generator=g)) for _ in range(4)]
    step, measured, t0, c0 = 0, 0, 0.0, 0.0
    while True:
        if step == 3:
            t0, c0 = time.perf_counter(), time.process_time()
        x, y = batches[step % 4]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled="amp=bf16" in variant):
            loss = gm.gpt_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= 3:
            measured += 1
            if measured >= 5 and time.perf_counter() - t0 >= seconds:
                break
        step += 1
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"RESULT impl=pytorch-{torch.__version__} model=gpt threads={threads} ranks=1 rate={measured * B * T / dt:.1f} "
          f"unit=tokens/s step_ms={1e3 * dt / measured:.2f} steps={measured} peak_rss_mb={rss:.1f} cpu_step_ms={1e3 * dc / measured:.2f} T={T} "
          f"attention={'flash' if 'flash' in variant else 'plain'} ckpt={int('ckpt' in variant)} "
          f"amp={'bf16' if 'amp=bf16' in variant else 'off'}")
    assert math.isfinite(loss.item())


if __name__ == "__main__":
    main()
