"""The README's demo in PyTorch: `ctrain run --nproc-per-node 2 ctrain train cnn --epochs 2`
as a PyTorch user writes it, for bench/demo.sh to time side by side.

    torchrun --nproc-per-node 2 bench/demo_torch.py [--epochs 2] [--data-dir DIR]

The same training as ctrain's defaults (src/cli/train_opts.c, src/train/trainer.c): the CNN of
src/models/cnn.c (tests/torch/gen_models.py's CNN: conv 1-32-64 k5, fc 128, dropout 0), SGD lr
0.05 momentum 0.9, cosine decay per step to 0.1 x lr over all steps, batch 64 per rank (last
partial batch dropped), DistributedSampler(shuffle, seed 1337), DDP over gloo, one thread per rank
(torchrun's OMP_NUM_THREADS=1, as ctrain's cores / local ranks here); pixels / 255 normalised with
Fashion-MNIST's mean 0.2860 and std 0.3530; after each epoch the test set (10,000) is evaluated,
split over the ranks. Rank 0 prints the test accuracy per epoch and the wall time from the
process start (imports included) and of the training alone.
"""
import argparse
import gzip
import math
import os
import sys
import time

T_START = time.perf_counter()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "torch"))
import gen_models as gm  # noqa: E402

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    """An IDX file (.gz or plain) as a numpy array."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data_dir, split):
    x = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte"))
    y = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte"))
    x = (torch.from_numpy(x.astype(np.float32)) / 255.0 - MEAN) / STD
    return x.unsqueeze(1).contiguous(), torch.from_numpy(y.astype(np.int64))


def lr_at(step, total, base, floor):
    """ctrain's cosine schedule (src/optim/schedule.c) without warmup."""
    progress = min(step / max(total, 1), 1.0)
    return floor + (base - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


@torch.no_grad()
def evaluate(model, x, y, rank, world, batch):
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64)  # loss * count, correct, count
    idx = torch.arange(rank, len(x), world)
    for b in range(0, len(idx), batch):
        i = idx[b:b + batch]
        out = model(x[i])
        sums[0] += F.cross_entropy(out, y[i]).item() * len(i)
        sums[1] += (out.argmax(1) == y[i]).sum().item()
        sums[2] += len(i)
    dist.all_reduce(sums)
    model.train()
    return sums[0].item() / sums[2].item(), sums[1].item() / sums[2].item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--init-raw", help="initial weights: the parameters as raw float32 in registration order "
                    "(ctrain's flat parameter buffer), to train from the same draw as ctrain")
    ap.add_argument("--data-dir", default=os.environ.get("CTRAIN_DATA_DIR") or "/usr/share/datasets/fashion-mnist")
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    xtr, ytr = load(a.data_dir, "train")
    xte, yte = load(a.data_dir, "t10k")
    torch.manual_seed(a.seed)
    model = gm.CNN()
    if a.init_raw:
        flat = torch.from_numpy(np.fromfile(a.init_raw, dtype=np.float32))
        params = list(model.parameters())
        if flat.numel() != sum(p.numel() for p in params):
            sys.exit(f"--init-raw: {flat.numel()} floats, the model has {sum(p.numel() for p in params)}")
        with torch.no_grad():
            at = 0
            for p in params:
                p.copy_(flat[at:at + p.numel()].view_as(p))
                at += p.numel()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    sampler = torch.utils.data.distributed.DistributedSampler(range(len(xtr)), num_replicas=world, rank=rank,
                                                              shuffle=True, seed=a.seed)
    per_epoch = len(sampler) // a.batch_size
    total = per_epoch * a.epochs
    step = 0
    t0 = time.perf_counter()
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        for b in range(per_epoch):
            i = order[b * a.batch_size:(b + 1) * a.batch_size]
            for g in opt.param_groups:
                g["lr"] = lr_at(step, total, a.lr, 0.1 * a.lr)
            loss = F.cross_entropy(ddp(xtr[i]), ytr[i])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
        tl, acc = evaluate(model, xte, yte, rank, world, a.batch_size)
        if rank == 0:
            print(f"epoch {epoch + 1}: train loss {loss.item():.4f} test loss {tl:.4f} accuracy {acc:.4f}", flush=True)
    t1 = time.perf_counter()
    if rank == 0:
        print(f"RESULT impl=pytorch torch={torch.__version__} ranks={world} threads={torch.get_num_threads()} "
              f"epochs={a.epochs} steps={step} accuracy={acc:.4f} train_s={t1 - t0:.1f} "
              f"process_s={t1 - T_START:.1f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
