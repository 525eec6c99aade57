"""PyTorch references for the modules and models of ctrain (tests/unit/test_nn_torch.c).

    /usr/bin/python3 tests/torch/gen_models.py            # writes tests/fixtures/models/
    /usr/bin/python3 tests/torch/gen_models.py --check-load KIND WEIGHTS REF
        # loads a ctrain-written state_dict with load_state_dict(strict=True) into the PyTorch
        # model KIND (mlp|cnn|gpt, sizes from REF's "config"), runs REF's "input" and compares
        # with REF's "output" (ctrain's forward, batch >= 2). Exit 0 if every logit vector v has
        # max|v - ctrain's| <= 1e-5 max|ctrain's|.

Per module case NAME:
  NAME.weights.safetensors  the module's state_dict (PyTorch-initialised, PyTorch-written)
  NAME.ref.safetensors      input, grad_out (R), output, grad.input (float inputs),
                            grad.<param> — gradients of sum(R * module(input)); and
                            exact.output, exact.grad.*: the same computed in float64
                            (stored rounded to f32), to measure PyTorch's own f32 error
Per model (mlp, cnn, gpt):
  model_KIND.weights.safetensors  state_dict (GPT: with the tied "lm_head.weight", as PyTorch writes it)
  model_KIND.ref.safetensors      config (I64), input, target, output, loss, grad.<param>
                                  (gradients of the mean cross-entropy), exact.* (float64),
                                  and 20 steps of plain
                                  SGD (p -= lr * grad) on batches train.x[s % 4], train.y[s % 4]:
                                  train.lr, train.loss [20] (loss before each step's update)
Dropout is p = 0 everywhere. Sizes are small: the whole folder stays well under 3 MB.
"""
import copy
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import st  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "models")


# ---------------------------------------------------------------- reference models
def make_mlp(cfg):
    """cfg: in, hidden list, out, dropout -> nn.Sequential, as ctrain numbers it."""
    layers, prev = [], cfg["in"]
    for h in cfg["hidden"]:
        layers += [nn.Linear(prev, h), nn.ReLU()]
        if cfg.get("dropout", 0) > 0:
            layers.append(nn.Dropout(cfg["dropout"]))
        prev = h
    layers.append(nn.Linear(prev, cfg["out"]))
    return nn.Sequential(*layers)


class CNN(nn.Module):
    def __init__(self, in_channels=1, height=28, width=28, c1=32, c2=64, kernel=5, fc=128, classes=10, dropout=0.0):
        super().__init__()
        p = kernel // 2
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, kernel, padding=p), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, kernel, padding=p), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(
            nn.Linear(c2 * (height // 4) * (width // 4), fc), nn.ReLU(), nn.Dropout(dropout), nn.Linear(fc, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


# nanoGPT (model.py), minus flash attention (PyTorch 1.13 has none): same names and math.
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, dropout=0.0, bias=True):
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd, dropout=0.0, bias=True):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout=0.0, bias=True):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, dropout, bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_embd, n_head, block_size, vocab_size, dropout=0.0, bias=True):
        super().__init__()
        self.block_size = block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList([Block(n_embd, n_head, dropout, bias) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def gpt_loss(logits, targets):
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


# ---------------------------------------------------------------- configs shared with the C test
MLP_CFG = dict(**{"in": 784}, hidden=[64, 32], out=10, dropout=0.0)
CNN_CFG = dict(in_channels=1, height=28, width=28, c1=4, c2=8, kernel=5, fc=32, classes=10, dropout=0.0)
GPT_CFG = dict(n_layer=2, n_embd=32, n_head=4, block_size=16, vocab_size=64, dropout=0.0, bias=True)


def build(kind, cfg):
    if kind == "mlp":
        return make_mlp(cfg)
    if kind == "cnn":
        return CNN(**cfg)
    return GPT(**cfg)


def config_tensor(kind, cfg):
    if kind == "mlp":
        v = [cfg["in"], cfg["out"], len(cfg["hidden"])] + cfg["hidden"]
    elif kind == "cnn":
        v = [cfg[k] for k in ("in_channels", "height", "width", "c1", "c2", "kernel", "fc", "classes")]
    else:
        v = [cfg[k] for k in ("n_layer", "n_embd", "n_head", "block_size", "vocab_size")]
    return torch.tensor(v, dtype=torch.int64)


def config_from_tensor(kind, v):
    v = [int(x) for x in v]
    if kind == "mlp":
        return dict(**{"in": v[0]}, out=v[1], hidden=v[3:3 + v[2]], dropout=0.0)
    if kind == "cnn":
        return dict(zip(("in_channels", "height", "width", "c1", "c2", "kernel", "fc", "classes"), v), dropout=0.0)
    return dict(zip(("n_layer", "n_embd", "n_head", "block_size", "vocab_size"), v), dropout=0.0, bias=True)


# ---------------------------------------------------------------- helpers
def rand(*shape):
    return torch.randn(*shape, dtype=torch.float32)


def save(name, tensors):
    path = os.path.join(ROOT, name)
    st.save(path, {k: v.detach().contiguous() for k, v in tensors.items()}, metadata={"format": "pt"})
    return os.path.getsize(path)


def exact_module(mod, x, R, requires_grad):
    """the same in float64 (the "exact" answer), rounded to f32 for storage"""
    m64 = copy.deepcopy(mod).double()
    x64 = x.detach().double() if x.is_floating_point() else x.detach()
    if requires_grad:
        x64.requires_grad_(True)
    y64 = m64(x64)
    (y64 * R.double()).sum().backward()
    out = {"exact.output": y64.float()}
    if requires_grad:
        out["exact.grad.input"] = x64.grad.float()
    for pn, p in m64.named_parameters():
        out["exact.grad." + pn] = p.grad.float()
    return out


def module_case(name, mod, x, requires_grad=True):
    """forward + backward of sum(R * mod(x)); writes NAME.weights / NAME.ref"""
    mod.train()
    x = x.clone()
    if requires_grad:
        x.requires_grad_(True)
    y = mod(x)
    R = rand(*y.shape)
    (y * R).sum().backward()
    ref = {"input": x, "grad_out": R, "output": y}
    if requires_grad:
        ref["grad.input"] = x.grad
    for pn, p in mod.named_parameters():
        ref["grad." + pn] = p.grad
    ref.update(exact_module(mod, x, R, requires_grad))
    sd = mod.state_dict()
    n = save(name + ".weights.safetensors", sd) if sd else 0
    return n + save(name + ".ref.safetensors", ref)


def model_case(kind, cfg, B, lr=0.05, steps=20, nbatch=4):
    model = build(kind, cfg)
    model.train()
    loss_fn = gpt_loss if kind == "gpt" else F.cross_entropy
    if kind == "mlp":
        xs = rand(nbatch, B, cfg["in"])
        ys = torch.randint(0, cfg["out"], (nbatch, B))
    elif kind == "cnn":
        xs = torch.rand(nbatch, B, cfg["in_channels"], cfg["height"], cfg["width"])  # image-like, [0, 1)
        ys = torch.randint(0, cfg["classes"], (nbatch, B))
    else:
        T = cfg["block_size"] - 3  # shorter than the context on purpose
        seq = torch.randint(0, cfg["vocab_size"], (nbatch, B, T + 1))
        xs, ys = seq[..., :-1].contiguous(), seq[..., 1:].contiguous()
        ys[0, 0, 2] = -1  # an ignored position
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    size = save("model_%s.weights.safetensors" % kind, sd)

    ref = {"config": config_tensor(kind, cfg), "input": xs[0], "target": ys[0]}
    out = model(xs[0])
    loss = loss_fn(out, ys[0])
    loss.backward()
    ref["output"], ref["loss"] = out, loss.reshape(1)
    for pn, p in model.named_parameters():  # tied wte listed once, with its total gradient
        ref["grad." + pn] = p.grad.clone()
    model.zero_grad(set_to_none=False)
    m64 = copy.deepcopy(model).double()  # the exact answer (float64), stored rounded to f32
    x64 = xs[0].double() if xs.is_floating_point() else xs[0]
    out64 = m64(x64)
    loss64 = loss_fn(out64, ys[0])
    loss64.backward()
    ref["exact.output"], ref["exact.loss"] = out64.float(), loss64.float().reshape(1)
    for pn, p in m64.named_parameters():
        ref["exact.grad." + pn] = p.grad.float()

    losses = []
    for s in range(steps):
        l = loss_fn(model(xs[s % nbatch]), ys[s % nbatch])
        losses.append(l.item())
        l.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
                p.grad.zero_()
    ref["train.x"], ref["train.y"] = xs, ys
    ref["train.lr"] = torch.tensor([lr], dtype=torch.float32)
    ref["train.loss"] = torch.tensor(losses, dtype=torch.float64)
    print("  %s: loss %.5f -> %.5f over %d steps" % (kind, losses[0], losses[-1], steps))
    return size + save("model_%s.ref.safetensors" % kind, ref)


def generate():
    os.makedirs(ROOT, exist_ok=True)
    torch.manual_seed(1234)
    total = 0
    total += module_case("linear", nn.Linear(7, 5), rand(3, 4, 7))
    total += module_case("linear_nobias", nn.Linear(6, 4, bias=False), rand(5, 6))
    total += module_case("conv2d", nn.Conv2d(3, 4, 3, padding=1), rand(2, 3, 7, 6))
    total += module_case("conv2d_s2", nn.Conv2d(2, 3, 5, stride=2, padding=2), rand(2, 2, 9, 9))
    total += module_case("maxpool2d", nn.MaxPool2d(2), rand(2, 3, 7, 8))
    total += module_case("maxpool2d_k3s2p1", nn.MaxPool2d(3, 2, 1), rand(2, 2, 9, 9))
    total += module_case("embedding", nn.Embedding(11, 6), torch.randint(0, 11, (3, 5)), requires_grad=False)
    total += module_case("layernorm", nn.LayerNorm(9), rand(4, 3, 9) * 2 + 0.5)
    total += module_case("dropout", nn.Dropout(0.0), rand(3, 5))
    total += module_case("relu", nn.ReLU(), rand(4, 7))
    total += module_case("gelu", nn.GELU(), rand(4, 7) * 3)
    total += module_case("gelu_tanh", nn.GELU(approximate="tanh"), rand(4, 7) * 3)
    total += module_case("tanh", nn.Tanh(), rand(4, 7) * 2)
    total += module_case("sigmoid", nn.Sigmoid(), rand(4, 7) * 3)
    total += module_case("flatten", nn.Flatten(), rand(2, 3, 4, 5))
    total += module_case("sequential", nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(48, 5), nn.Tanh(),
        nn.Dropout(0.0), nn.Linear(5, 3), nn.GELU()), rand(2, 2, 8, 8))
    total += module_case("attention", CausalSelfAttention(16, 4), rand(2, 5, 16))
    total += model_case("mlp", MLP_CFG, B=8)
    total += model_case("cnn", CNN_CFG, B=4)
    total += model_case("gpt", GPT_CFG, B=3)
    print("wrote %s: %d bytes" % (os.path.normpath(ROOT), total))


def check_load(kind, weights, refpath):
    ref = st.load(refpath)
    cfg = config_from_tensor(kind, ref["config"])
    model = build(kind, cfg)
    sd = st.load(weights)
    model.load_state_dict(sd, strict=True)
    model.eval()
    x, want = ref["input"], ref["output"]
    with torch.no_grad():
        out = model(x)
    if x.shape[0] < 2 or out.shape != want.shape:
        print("  %s: batch %s, logits %s vs ctrain's %s" % (kind, tuple(x.shape), tuple(out.shape), tuple(want.shape)))
        return 1
    # Relative error of each logit vector (one per sample, per position for the GPT), in the
    # max norm: an elementwise ratio would be dominated by logits that happen to be near 0.
    d = (out - want).abs().amax(dim=-1)
    err = (d / want.abs().amax(dim=-1).clamp(min=1e-30)).max().item()
    print("  %s: %d tensors loaded with load_state_dict(strict=True); logits %s vs ctrain's: max rel err %.2e"
          % (kind, len(sd), "x".join(map(str, out.shape)), err))
    return 0 if err <= 1e-5 else 1


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--check-load":
        sys.exit(check_load(sys.argv[2], sys.argv[3], sys.argv[4]))
    generate()
