"""PyTorch side of bench/attention_bench.c: F.scaled_dot_product_attention (is_causal=True),
forward + backward on the same shapes (1 x 8 heads x T x D, f32), best of 5 (wall; *_cpu_ms:
process CPU time), and the plain softmax(q k^T) v for reference. One RESULT line per T in attention_bench's units.

    PYTHON bench/torch_attention.py THREADS [D]      # PyTorch >= 2
"""
import math
import sys
import time

import torch
import torch.nn.functional as F


def plain(q, k, v):
    T = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def best(fn, T, D):
    g = torch.Generator().manual_seed(1)
    q, k, v, dy = (torch.rand(1, 8, T, D, generator=g) * 2 - 1 for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    out, cpu = 1e30, 1e30
    for _ in range(6):  # the first warms up
        for t in (q, k, v):
            t.grad = None
        t0, c0 = time.perf_counter(), time.process_time()
        fn(q, k, v).backward(dy)
        out, cpu = min(out, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return out, cpu


def main():
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    D = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    torch.set_num_threads(threads)
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    for T in (256, 1024, 2048):
        (s, sc), (p, pc) = best(sdpa, T, D), best(plain, T, D)
        print(f"RESULT torch_attention T={T} D={D} heads=8 threads={threads} sdpa_ms={1e3 * s:.2f} plain_ms={1e3 * p:.2f} "
              f"sdpa_cpu_ms={1e3 * sc:.2f} plain_cpu_ms={1e3 * pc:.2f} torch={torch.__version__}")


if __name__ == "__main__":
    main()
