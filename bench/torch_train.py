"""PyTorch side of bench/run.sh: the same models, sizes, optimizers and synthetic data as
bench/train_bench.c, one line per result in the same format.

    /usr/bin/python3 bench/torch_train.py single mlp|gpt|gptf|cnn|llama THREADS [SECONDS] [amp=bf16]
    /usr/bin/python3 bench/torch_train.py ddp    mlp|gpt|gptf|cnn|llama NRANKS  [SECONDS]   # gloo, 1 thread/rank
    torchrun ... bench/torch_train.py torchrun mlp|gpt|cnn 0 [SECONDS]   # ranks from torchrun (bench/multinode.sh)
    build/venv-bench/bin/python bench/torch_train.py fsdp gpt|gptf|llama NRANKS [SECONDS]   # FSDP FULL_SHARD, gloo
    torchrun ... bench/torch_train.py torchrun-fsdp gpt|gptf|llama 0 [SECONDS]

Models: tests/torch/gen_models.py (nanoGPT's GPT without flash attention, which PyTorch 1.13
lacks; MLP as nn.Sequential; the CNN). gptf: the same GPT with nanoGPT's own attention on
PyTorch >= 2, F.scaled_dot_product_attention(is_causal=True), against ctrain's fused one.
llama: a plain Llama (Hugging Face's LlamaForCausalLM layout: RMSNorm, rotary embeddings,
SwiGLU, no biases) of the GPT's sizes with 8 query / 2 key-value heads, its attention
F.scaled_dot_product_attention(is_causal=True, enable_gqa=True) (PyTorch >= 2.5).
amp=bf16: the step under torch.autocast("cpu", torch.bfloat16). Warmup steps are excluded; steps then run until
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
LLAMA_CFG = dict(n_layer=6, n_embd=256, n_head=8, n_kv_head=2, inter=688, block_size=256, vocab_size=256, eps=1e-6,
                 theta=10000.0)
CNN_CFG = dict(in_channels=1, height=28, width=28, c1=32, c2=64, kernel=5, fc=128, classes=10, dropout=0.0)


def sdpa_forward(self, x):
    """nanoGPT's CausalSelfAttention.forward where PyTorch has SDPA (its `flash` branch)."""
    B, T, C = x.size()
    q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
    q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class LlamaLayer(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        C, H, KV, D = c["n_embd"], c["n_head"], c["n_kv_head"], c["n_embd"] // c["n_head"]
        self.H, self.KV, self.D = H, KV, D
        self.ln1 = torch.nn.RMSNorm(C, eps=c["eps"])
        self.ln2 = torch.nn.RMSNorm(C, eps=c["eps"])
        self.q = torch.nn.Linear(C, H * D, bias=False)
        self.k = torch.nn.Linear(C, KV * D, bias=False)
        self.v = torch.nn.Linear(C, KV * D, bias=False)
        self.o = torch.nn.Linear(H * D, C, bias=False)
        self.gate = torch.nn.Linear(C, c["inter"], bias=False)
        self.up = torch.nn.Linear(C, c["inter"], bias=False)
        self.down = torch.nn.Linear(c["inter"], C, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.ln1(x)
        q = self.q(h).view(B, T, self.H, self.D).transpose(1, 2)
        k = self.k(h).view(B, T, self.KV, self.D).transpose(1, 2)
        v = self.v(h).view(B, T, self.KV, self.D).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        h = self.ln2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def rope(x, cos, sin):  # Hugging Face's rotate_half convention
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


class Llama(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed = torch.nn.Embedding(c["vocab_size"], c["n_embd"])
        self.layers = torch.nn.ModuleList(LlamaLayer(c) for _ in range(c["n_layer"]))
        self.norm = torch.nn.RMSNorm(c["n_embd"], eps=c["eps"])
        self.lm_head = torch.nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        D = c["n_embd"] // c["n_head"]
        inv = 1.0 / (c["theta"] ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
        f = torch.outer(torch.arange(c["block_size"], dtype=torch.float32), inv)
        emb = torch.cat((f, f), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        for m in self.modules():  # Hugging Face's init: normal(0, 0.02)
            if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.embed(idx)
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def is_gpt(kind):  # the language models (token batches, AdamW, tokens/s)
    return kind in ("gpt", "gptf", "llama")


def setup(kind, rank):
    torch.manual_seed(1234)
    if kind == "gptf":
        if not hasattr(F, "scaled_dot_product_attention"):
            sys.exit(f"gptf needs F.scaled_dot_product_attention (PyTorch >= 2.0), not {torch.__version__}")
        gm.CausalSelfAttention.forward = sdpa_forward
    if kind == "llama" and not hasattr(torch.nn, "RMSNorm"):
        sys.exit(f"llama needs torch.nn.RMSNorm and SDPA's enable_gqa (PyTorch >= 2.5), not {torch.__version__}")
    if is_gpt(kind):
        model = Llama(LLAMA_CFG) if kind == "llama" else gm.GPT(**GPT_CFG)
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
        c = LLAMA_CFG if kind == "llama" else GPT_CFG
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
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=AMP):
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
AMP = False  # amp=bf16: the step under torch.autocast("cpu", bfloat16)


def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def line(kind, threads, ranks, rate, step_ms, steps, rss, flops):
    unit = "tokens/s" if is_gpt(kind) else "samples/s"
    wait = os.environ.get("OMP_WAIT_POLICY", "default").lower()
    print(f"RESULT impl=pytorch model={kind} threads={threads} ranks={ranks} rate={rate:.1f} unit={unit} "
          f"step_ms={step_ms:.2f} steps={steps} peak_rss_mb={rss:.1f} flops_per_step={flops:.4g} "
          f"omp_wait={wait} torch={torch.__version__} cpu_step_ms={CPU_STEP_MS:.2f} amp={'bf16' if AMP else 'off'}", flush=True)


def fsdp_wrap(kind, model):
    """FULL_SHARD FSDP on the CPU (gloo), one unit per transformer block (ctrain --shard full's
    units); the optimizer is made again over the sharded parameters, AdamW as in setup()."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    block = LlamaLayer if kind == "llama" else gm.Block
    net = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, auto_wrap_policy=ModuleWrapPolicy({block}),
               device_id=torch.device("cpu"), use_orig_params=True)
    decay = [p for n, p in net.named_parameters() if not (n.endswith("bias") or "ln" in n or "norm" in n)]
    nodecay = [p for n, p in net.named_parameters() if n.endswith("bias") or "ln" in n or "norm" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95))
    return net, opt


def ddp_worker(rank, nranks, kind, seconds, port, q, amp=False, fsdp=False):
    import torch.distributed as dist
    global AMP
    AMP = amp  # a spawned process starts from the module's default
    torch.set_num_threads(1)
    if port:  # else torchrun set MASTER_ADDR/MASTER_PORT (its agent's store)
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=nranks)
    model, opt, batches, items = setup(kind, rank)
    if fsdp:
        flops = flops_per_step(kind, model, items)  # from the whole model, before sharding
        ddp, opt = fsdp_wrap(kind, model)
    else:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        flops = None
    rate, ms, steps = train(kind, seconds, rank, ddp, model, opt, batches, items, barrier=dist.barrier)
    q.put((rank, rate, ms, steps, peak_mb(), flops if flops is not None else flops_per_step(kind, model, items), CPU_STEP_MS))
    dist.barrier()
    dist.destroy_process_group()


def main():
    mode, kind, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 8.0
    global AMP
    AMP = len(sys.argv) > 5 and sys.argv[5] == "amp=bf16"
    if mode == "single":
        torch.set_num_threads(n)
        model, opt, batches, items = setup(kind, 0)
        rate, ms, steps = train(kind, seconds, model=model, opt=opt, batches=batches, items=items)
        line(kind, n, 1, rate, ms, steps, peak_mb(), flops_per_step(kind, model, items))
    elif mode in ("ddp", "fsdp"):
        import socket
        import torch.multiprocessing as mp
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        ctx = mp.get_context("spawn")
        q = ctx.SimpleQueue()
        procs = [ctx.Process(target=ddp_worker, args=(r, n, kind, seconds, port, q, AMP, mode == "fsdp")) for r in range(n)]
        for p in procs:
            p.start()
        res = sorted(q.get() for _ in range(n))
        for p in procs:
            p.join()
        r0 = res[0]
        global CPU_STEP_MS
        CPU_STEP_MS = r0[6]  # rank 0's, measured in its process
        line(kind, 1, n, r0[1], r0[2], r0[3], max(r[4] for r in res), r0[5])
    elif mode in ("torchrun", "torchrun-fsdp"):  # one process per rank, started by torchrun; rank 0 prints
        class Q:
            def put(self, r):
                self.r = r
        q, rank, nranks = Q(), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        ddp_worker(rank, nranks, kind, seconds, 0, q, AMP, mode == "torchrun-fsdp")
        if rank == 0:
            line(kind, 1, nranks, q.r[1], q.r[2], q.r[3], q.r[4], q.r[5])  # CPU_STEP_MS: this process's
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
