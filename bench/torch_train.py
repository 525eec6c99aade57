"""PyTorch side of bench/run.sh: the same models, sizes, optimizers and synthetic data as
bench/train_bench.c, one line per result in the same format.

    /usr/bin/python3 bench/torch_train.py single mlp|gpt|gptf|cnn THREADS [SECONDS]
    /usr/bin/python3 bench/torch_train.py ddp    mlp|gpt|gptf|cnn NRANKS  [SECONDS]   # gloo, 1 thread/rank
    torchrun ... bench/torch_train.py torchrun mlp|gpt|cnn 0 [SECONDS]   # ranks from torchrun (bench/multinode.sh)

Models: tests/torch/gen_models.py (nanoGPT's GPT without flash attention, which PyTorch 1.13
lacks; MLP as nn.Sequential; the CNN). gptf: the same GPT with nanoGPT's own attention on
PyTorch >= 2, F.scaled_dot_product_attention(is_causal=True), against ctrain's fused one. Warmup steps are excluded; steps then run until
SECONDS have passed (at least 5). Peak memory = ru_maxrss of the process (DDP: worst rank).
OMP_WAIT_POLICY is whatever the caller's environment says (run.sh tries default and passive).
"""
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "torch"))
import gen_models as gm  # noqa: E402

GPT_CFG = dict(n_layer=6, n_embd=256, n_head=8, block_size=256, vocab_size=256, dropout=0.0, bias=True)
MLP_CFG = {"in": 784, "hidden": [1024, 1024], "out": 10, "dropout": 0.0}
CNN_CFG = dict(in_channels=1, height=28, width=28, c1=32, c2=64, kernel=5, fc=128, classes=10, dropout=0.0)


def sdpa_forward(self, x):
    """nanoGPT's CausalSelfAttention.forward where PyTorch has SDPA (its `flash` branch)."""
    B, T, C = x.size()
    q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
    q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def is_gpt(kind):
    return kind in ("gpt", "gptf")


def setup(kind, rank):
    torch.manual_seed(1234)
    if kind == "gptf":
        if not hasattr(F, "scaled_dot_product_attention"):
            sys.exit(f"gptf needs F.scaled_dot_product_attention (PyTorch >= 2.0), not {torch.__version__}")
        gm.CausalSelfAttention.forward = sdpa_forward
    if is_gpt(kind):
        model = gm.GPT(**GPT_CFG)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        nodecay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                                lr=3e-4, betas=(0.9, 0.95))
        B, T = 8, GPT_CFG["block_size"]
    else:
        model = gm.make_mlp(MLP_CFG) if kind == "mlp" else gm.CNN(**CNN_CFG)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        B, T = 128, 1
    g = torch.Generator().manual_seed(4321 + rank)
    batches = []
    for _ in range(4):
        if is_gpt(kind):
            x = torch.randint(0, GPT_CFG["vocab_size"], (B, T), generator=g)
            y = torch.randint(0, GPT_CFG["vocab_size"], (B, T), generator=g)
        else:
            shape = (B, 784) if kind == "mlp" else (B, 1, 28, 28)
            x = torch.rand(shape, generator=g)
            y = torch.randint(0, 10, (B,), generator=g)
        batches.append((x, y))
    return model, opt, batches, B * T


def flops_per_step(kind, model, items):
    if is_gpt(kind):
        n = sum(p.numel() for p in model.parameters())
        c = GPT_CFG
        return 6.0 * n * items + 12.0 * c["n_layer"] * c["block_size"] * c["n_embd"] * items
    if kind == "cnn":  # train_bench's count: convolutions by their MACs, not their parameters
        c = CNN_CFG
        H, W, k = c["height"], c["width"], c["kernel"]
        conv1 = H * W * c["c1"] * c["in_channels"] * k * k
        conv2 = (H // 2) * (W // 2) * c["c2"] * c["c1"] * k * k
        fc = c["c2"] * (H // 4) * (W // 4) * c["fc"] + c["fc"] * c["classes"]
        return 6.0 * items * (conv1 + conv2 + fc)
    return 6.0 * sum(p.numel() for p in model.parameters()) * items


def train(kind, seconds, rank=0, ddp_model=None, model=None, opt=None, batches=None, items=0, barrier=None):
    net = ddp_model if ddp_model is not None else model
    warmup = 3 if is_gpt(kind) else 10
    step, measured, t0, c0 = 0, 0, 0.0, 0.0
    while True:
        if step == warmup:
            if barrier:
                barrier()
            t0 = time.perf_counter()
            c0 = time.process_time()
        x, y = batches[step % len(batches)]
        out = net(x)
        loss = gm.gpt_loss(out, y) if is_gpt(kind) else F.cross_entropy(out, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        lv = loss.item()
        if step >= warmup:
            measured += 1
            done = measured >= 5 and time.perf_counter() - t0 >= seconds
            if barrier:  # all ranks stop at the same step
                d = torch.tensor([1 if done else 0])
                torch.distributed.all_reduce(d, op=torch.distributed.ReduceOp.MIN)
                done = bool(d.item())
            if done:
                break
        step += 1
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    assert lv == lv, "loss is nan"
    global CPU_STEP_MS
    CPU_STEP_MS = 1e3 * dc / measured  # process CPU time per step (all threads), as train_bench's
    return measured * items / dt, 1e3 * dt / measured, measured


CPU_STEP_MS = float("nan")


def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def line(kind, threads, ranks, rate, step_ms, steps, rss, flops):
    unit = "tokens/s" if is_gpt(kind) else "samples/s"
    wait = os.environ.get("OMP_WAIT_POLICY", "default").lower()
    print(f"RESULT impl=pytorch model={kind} threads={threads} ranks={ranks} rate={rate:.1f} unit={unit} "
          f"step_ms={step_ms:.2f} steps={steps} peak_rss_mb={rss:.1f} flops_per_step={flops:.4g} "
          f"omp_wait={wait} torch={torch.__version__} cpu_step_ms={CPU_STEP_MS:.2f}", flush=True)


def ddp_worker(rank, nranks, kind, seconds, port, q):
    import torch.distributed as dist
    torch.set_num_threads(1)
    if port:  # else torchrun set MASTER_ADDR/MASTER_PORT (its agent's store)
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=nranks)
    model, opt, batches, items = setup(kind, rank)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    rate, ms, steps = train(kind, seconds, rank, ddp, model, opt, batches, items, barrier=dist.barrier)
    q.put((rank, rate, ms, steps, peak_mb(), flops_per_step(kind, model, items), CPU_STEP_MS))
    dist.barrier()
    dist.destroy_process_group()


def main():
    mode, kind, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 8.0
    if mode == "single":
        torch.set_num_threads(n)
        model, opt, batches, items = setup(kind, 0)
        rate, ms, steps = train(kind, seconds, model=model, opt=opt, batches=batches, items=items)
        line(kind, n, 1, rate, ms, steps, peak_mb(), flops_per_step(kind, model, items))
    elif mode == "ddp":
        import socket
        import torch.multiprocessing as mp
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        ctx = mp.get_context("spawn")
        q = ctx.SimpleQueue()
        procs = [ctx.Process(target=ddp_worker, args=(r, n, kind, seconds, port, q)) for r in range(n)]
        for p in procs:
            p.start()
        res = sorted(q.get() for _ in range(n))
        for p in procs:
            p.join()
        r0 = res[0]
        global CPU_STEP_MS
        CPU_STEP_MS = r0[6]  # rank 0's, measured in its process
        line(kind, 1, n, r0[1], r0[2], r0[3], max(r[4] for r in res), r0[5])
    elif mode == "torchrun":  # one process per rank, started by torchrun; rank 0 prints
        class Q:
            def put(self, r):
                self.r = r
        q, rank, nranks = Q(), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        ddp_worker(rank, nranks, kind, seconds, 0, q)
        if rank == 0:
            line(kind, 1, nranks, q.r[1], q.r[2], q.r[3], q.r[4], q.r[5])  # CPU_STEP_MS: this process's
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
