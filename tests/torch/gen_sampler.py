"""Reference indices from PyTorch 1.13's DistributedSampler for tests/unit/test_sampler.c.

    /usr/bin/python3 tests/torch/gen_sampler.py   # writes tests/fixtures/sampler/distributed_sampler.safetensors

Per case k:
  case.k.params  I64 [8]: n, num_replicas, shuffle, seed (uint64 bits), epoch, drop_last,
                          full (1: all indices stored, 0: head + hash), num_samples
  case.k.idx     I32 [R, num_samples]         every rank's indices        (full cases)
  case.k.head    I64 [R, min(16, num_samples)] the first indices per rank  (large cases)
  case.k.hash    I64 [R] FNV-1a 64 over each rank's indices as 64-bit words (large cases):
                 h = 0xcbf29ce484222325; for x: h ^= x; h *= 0x100000001b3 (mod 2^64)
"""
import os
import sys

import torch
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(__file__))
import st  # noqa: E402

M64 = (1 << 64) - 1


class Len:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def fnv(xs):
    h = 0xCBF29CE484222325
    for x in xs:
        h = ((h ^ (x & M64)) * 0x100000001B3) & M64
    return h


def s64(u):
    return u - (1 << 64) if u >= (1 << 63) else u


def ranks(n, R, shuffle, seed, epoch, drop_last):
    out = []
    for r in range(R):
        s = DistributedSampler(Len(n), num_replicas=R, rank=r, shuffle=shuffle, seed=seed, drop_last=drop_last)
        s.set_epoch(epoch)
        idx = list(iter(s))
        assert len(idx) == len(s)
        out.append(idx)
    return out


tensors = {}
k = 0
seeds = [0, 42, 7, (1 << 32) + 3, (1 << 64) - 2]
epochs = [0, 1, 5, 2, 1]


def add(n, R, shuffle, seed, epoch, drop_last, full):
    global k
    idx = ranks(n, R, shuffle, seed, epoch, drop_last)
    ns = len(idx[0])
    tensors[f"case.{k}.params"] = torch.tensor([n, R, int(shuffle), s64(seed), epoch, int(drop_last), int(full), ns],
                                               dtype=torch.int64)
    if full:
        tensors[f"case.{k}.idx"] = torch.tensor(idx, dtype=torch.int32).reshape(R, ns)
    else:
        h = min(16, ns)
        tensors[f"case.{k}.head"] = torch.tensor([x[:h] for x in idx], dtype=torch.int64).reshape(R, h)
        tensors[f"case.{k}.hash"] = torch.tensor([s64(fnv(x)) for x in idx], dtype=torch.int64)
    k += 1


j = 0
for n in [0, 1, 2, 3, 5, 7, 10, 11, 64, 257]:
    for R in [1, 2, 3, 4, 8]:
        for shuffle in [False, True]:
            for drop_last in [False, True]:
                add(n, R, shuffle, seeds[j % len(seeds)], epochs[j % len(epochs)], drop_last, True)
                j += 1
for n, R, seed, epoch, drop_last in [(100000, 1, 0, 0, False), (100000, 2, 42, 3, False), (100000, 3, 1, 0, True),
                                     (100000, 3, 1, 0, False), (100003, 8, 5, 9, False), (100003, 8, 5, 9, True),
                                     (60000, 2, 0, 0, False), (60000, 2, 0, 1, False), (1000000, 4, 123, 2, False)]:
    add(n, R, True, seed, epoch, drop_last, False)
add(100000, 3, False, 0, 0, False, False)

root = os.path.join(os.path.dirname(__file__), "..", "fixtures", "sampler")
os.makedirs(root, exist_ok=True)
path = os.path.join(root, "distributed_sampler.safetensors")
st.save(path, tensors, metadata={"cases": str(k), "torch": torch.__version__})
print("wrote", os.path.normpath(path), k, "cases,", os.path.getsize(path), "bytes")
