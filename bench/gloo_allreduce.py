"""PyTorch gloo baseline for bench/allreduce.sh: 2 ranks (GLOO_NP=4: 4), in-place all_reduce (f32 sum),
max time over ranks. Prints "gloo BYTES TIME_US BUSBW_GBS" per size.
Usage: /usr/bin/python3 bench/gloo_allreduce.py PORT BYTES...   (or: PORT init)
Under torchrun (RANK/WORLD_SIZE set, bench/multinode.sh): PORT is ignored, one rank per process."""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, n, port, sizes):
    init = "env://" if "RANK" in os.environ else f"tcp://127.0.0.1:{port}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=n)
    torch.set_num_threads(1)
    for b in sizes:
        x = torch.zeros(max(b // 4, 1))
        iters = min(max((64 << 20) // b, 20), 2000)
        for _ in range(5):
            dist.all_reduce(x)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        t = t.item()
        if rank == 0:
            print(f"gloo {b} {t * 1e6:.3f} {2 * (n - 1) / n * b / t / 1e9:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    port = int(sys.argv[1])
    sizes = [int(s) for s in sys.argv[2:]]
    if "RANK" in os.environ:
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), port, sizes)
    else:
        n = int(os.environ.get("GLOO_NP", "2"))
        mp.spawn(worker, args=(n, port, sizes), nprocs=n)
