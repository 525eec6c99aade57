"""PyTorch's side of build/bench/qlinear_bench: nn.Linear in f32 and after
torch.ao.quantization.quantize_dynamic (engine x86/fbgemm when present), the same shapes,
GFLOP/s-equivalent (2MNK/t), best of 3 runs of >= 0.1 s.

    PY bench/torch_qlinear.py [THREADS] [quick]     (PY: a PyTorch from PyPI, for fbgemm)
"""
import sys
import time
import warnings

import torch
import torch.nn as nn

warnings.filterwarnings("ignore")


def best(fn):
    fn()
    b = 1e30
    for _ in range(3):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            t = time.perf_counter() - t0
            if t >= 0.1:
                break
        b = min(b, t / n)
    return b


def main():
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    quick = len(sys.argv) > 2 and sys.argv[2] == "quick"
    torch.set_num_threads(threads)
    for e in ("x86", "fbgemm", "onednn"):
        if e in torch.backends.quantized.supported_engines:
            torch.backends.quantized.engine = e
            break
    print(f"PyTorch {torch.__version__}, engine {torch.backends.quantized.engine}, {threads} thread(s) (GFLOP/s-equivalent)")
    print(f"{'M':>5} {'K':>5} {'N':>5} | {'f32':>9} {'int8':>9} {'ratio':>7}")
    for K in (1024, 2048, 4096):
        for M in (1, 16, 64, 256):
            if quick and (K not in (1024, 4096) or M not in (1, 256)):
                continue
            lin = nn.Linear(K, K)
            q = torch.ao.quantization.quantize_dynamic(nn.Sequential(lin), {nn.Linear}, dtype=torch.qint8)
            x = torch.randn(M, K)
            flop = 2.0 * M * K * K
            with torch.no_grad():
                tf = best(lambda: lin(x))
                ti = best(lambda: q(x))
            print(f"{M:>5} {K:>5} {K:>5} | {flop / tf * 1e-9:9.1f} {flop / ti * 1e-9:9.1f} {tf / ti:6.2f}x", flush=True)


if __name__ == "__main__":
    main()
