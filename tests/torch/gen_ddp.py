"""Reference for tests/unit/test_ddp_torch.c: PyTorch DDP (gloo, 2 ranks) with
DistributedSampler(shuffle=True) and a DataLoader, from fixed initial weights.

    /usr/bin/python3 tests/torch/gen_ddp.py   # writes tests/fixtures/ddp/*.safetensors

The MLP is nn.Sequential(Linear(20, 16), ReLU(), Linear(16, 5)) — ctrain's MLP with the same
state_dict names. 44 samples, 2 ranks, batch 4 per rank: 22 samples per rank, so each epoch
ends with a partial batch of 2 on both ranks. SGD(lr=0.05, momentum=0.9), 3 epochs.
The loss recorded per step is the average over ranks of each rank's batch loss."""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.dirname(__file__))
import st  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ddp")
N, IN, HID, C, B, EPOCHS, SEED = 44, 20, 16, 5, 4, 3, 3


def model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, C))


def worker(rank, world, X, Y, q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29533"
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    m = DDP(model())
    ds = TensorDataset(X, Y)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=SEED)
    loader = DataLoader(ds, batch_size=B, sampler=sampler)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            l = loss.detach().clone()
            dist.all_reduce(l)
            losses.append(l.item() / world)
    if rank == 0:
        q.put((losses, {k: v.tolist() for k, v in m.module.state_dict().items()}))
    dist.barrier()
    dist.destroy_process_group()


def main():
    torch.manual_seed(0)
    X = torch.randn(N, IN)
    Y = torch.randint(0, C, (N,), dtype=torch.int32)
    init = model().state_dict()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(r, 2, X, Y.long(), q)) for r in range(2)]
    for p in ps:
        p.start()
    losses, final = q.get()
    for p in ps:
        p.join()
    os.makedirs(OUT, exist_ok=True)
    st.save(os.path.join(OUT, "init.safetensors"), {k: v.contiguous() for k, v in init.items()})
    ref = {"x": X, "y": Y, "losses": torch.tensor(losses, dtype=torch.float64)}
    ref.update({"final." + k: torch.tensor(v) for k, v in final.items()})
    st.save(os.path.join(OUT, "ref.safetensors"), ref)
    print(f"{len(losses)} steps, first loss {losses[0]:.6f}, last {losses[-1]:.6f}")


if __name__ == "__main__":
    main()
