"""Writes tests/fixtures/optim/optim.safetensors, the PyTorch references for
tests/unit/test_optim.c (run with /usr/bin/python3):

    /usr/bin/python3 tests/torch/gen_optim.py

Contents (all little tensors; F64 for hyper-parameters and learning rates):
  init.<p>                 initial value of parameter p (three parameters of odd shapes)
  grad.<p>                 [STEPS, *shape] the gradient fed at each step (fixed random)
  <cfg>.hp                 F64 [kind(0 sgd, 1 adamw), momentum, dampening, nesterov, weight_decay,
                           beta1, beta2, eps, amsgrad, decay_only_ndim_ge2, maximize]
  <cfg>.lr                 F64 [STEPS] learning rate of each step
  <cfg>.<p>                [STEPS, *shape] parameter p after each step (torch.optim.SGD / AdamW,
                           default single-tensor implementation; weight-decay exclusion = a
                           second param group with weight_decay 0)
  clip<k>.max_norm, clip<k>.total (F32 scalar), clip<k>.<p>: torch.nn.utils.clip_grad_norm_
                           applied to clip.in.<p>
  sched.<name>.cfg         F64 [kind(0 constant, 1 linear, 2 cosine), base, min, warmup, total]
  sched.<name>.lr          F64 [N] lr of steps 0..N-1 from LambdaLR (HF-style lambdas below) or,
                           for sched.annealing, from torch.optim.lr_scheduler.CosineAnnealingLR
  scaler.found_inf (U8), scaler.scale (F32), scaler.tracker (I32): GradScaler's update rule
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import st  # noqa: E402

STEPS = 10
SHAPES = {"fc.weight": (7, 5), "fc.bias": (7,), "conv.weight": (3, 2, 5)}

torch.manual_seed(1234)
init = {k: torch.randn(s) for k, s in SHAPES.items()}
# gradients of varying magnitude per step, one step with an all-zero bias gradient
grads = {k: torch.randn((STEPS,) + s) * torch.logspace(-2, 1, STEPS).view((STEPS,) + (1,) * len(s))
         for k, s in SHAPES.items()}
grads["fc.bias"][4].zero_()

out = {}
for k in SHAPES:
    out["init." + k] = init[k]
    out["grad." + k] = grads[k]

cos_lrs = [6e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * i / STEPS))) for i in range(STEPS)]
CONFIGS = {
    # name: (kind, options, lr list)
    "sgd_plain": ("sgd", dict(), [0.1] * STEPS),
    "sgd_momentum": ("sgd", dict(momentum=0.9), [0.05] * STEPS),
    "sgd_nesterov": ("sgd", dict(momentum=0.9, nesterov=True), [0.05] * STEPS),
    "sgd_wd": ("sgd", dict(momentum=0.9, weight_decay=0.01), [0.05] * STEPS),
    "sgd_dampening": ("sgd", dict(momentum=0.8, dampening=0.3, weight_decay=1e-3), [0.03] * STEPS),
    "sgd_plain_wd_max": ("sgd", dict(weight_decay=0.05, maximize=True), [0.02] * STEPS),
    "adamw_default": ("adamw", dict(), [1e-3] * STEPS),
    "adamw_wd": ("adamw", dict(betas=(0.8, 0.99), weight_decay=0.1), [1e-2] * STEPS),
    "adamw_amsgrad": ("adamw", dict(amsgrad=True, weight_decay=0.05, eps=1e-6), [1e-2] * STEPS),
    "adamw_nodecay1d": ("adamw", dict(weight_decay=0.1, nodecay1d=True), [1e-2] * STEPS),
    "adamw_sched": ("adamw", dict(betas=(0.9, 0.95), weight_decay=0.1), cos_lrs),
}

for name, (kind, o, lrs) in CONFIGS.items():
    o = dict(o)
    nodecay1d = o.pop("nodecay1d", False)
    params = {k: init[k].clone().requires_grad_(True) for k in SHAPES}
    if nodecay1d:
        groups = [{"params": [p for p in params.values() if p.ndim >= 2]},
                  {"params": [p for p in params.values() if p.ndim < 2], "weight_decay": 0.0}]
    else:
        groups = list(params.values())
    if kind == "sgd":
        opt = torch.optim.SGD(groups, lr=lrs[0], **o)
        d = torch.optim.SGD([torch.zeros(1)], lr=1).defaults
    else:
        opt = torch.optim.AdamW(groups, lr=lrs[0], **o)
        d = torch.optim.AdamW([torch.zeros(1)]).defaults
    d = {**d, **o}
    betas = d.get("betas", (0.0, 0.0))
    out[name + ".hp"] = torch.tensor([
        0 if kind == "sgd" else 1, d.get("momentum", 0), d.get("dampening", 0), float(d.get("nesterov", False)),
        d["weight_decay"], betas[0], betas[1], d.get("eps", 0), float(d.get("amsgrad", False)),
        float(nodecay1d), float(d.get("maximize", False))], dtype=torch.float64)
    out[name + ".lr"] = torch.tensor(lrs, dtype=torch.float64)
    hist = {k: [] for k in SHAPES}
    for s in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = lrs[s]
        for k, p in params.items():
            p.grad = grads[k][s].clone()
        opt.step()
        for k, p in params.items():
            hist[k].append(p.detach().clone())
    for k in SHAPES:
        out[name + "." + k] = torch.stack(hist[k])

# ---- clip_grad_norm_
for k in SHAPES:
    out["clip.in." + k] = grads[k][STEPS - 1] * 3
for ci, max_norm in enumerate([1.0, 1e3, 0.25]):
    params = {k: torch.zeros(s, requires_grad=True) for k, s in SHAPES.items()}
    for k, p in params.items():
        p.grad = out["clip.in." + k].clone()
    total = torch.nn.utils.clip_grad_norm_(list(params.values()), max_norm)
    out["clip%d.max_norm" % ci] = torch.tensor(max_norm, dtype=torch.float64)
    out["clip%d.total" % ci] = total.detach().float().reshape(())
    for k, p in params.items():
        out["clip%d.%s" % (ci, k)] = p.grad.clone()


# ---- schedules: the lambdas of Hugging Face transformers' get_constant_schedule_with_warmup,
# get_linear_schedule_with_warmup and get_cosine_with_min_lr_schedule_with_warmup (min as a
# rate of base), the decay held at its end value after `total`
def lam(kind, base, mn, W, T):
    r = mn / base

    def f(step):
        if step < W:
            return float(step) / float(max(1, W))
        if kind == 0:
            return 1.0
        if kind == 1:
            x = max(0.0, float(T - step) / float(max(1, T - W)))
        else:
            progress = min(1.0, float(step - W) / float(max(1, T - W)))
            x = 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress))
        return x * (1 - r) + r
    return f


SCHEDS = {
    "constant_w": (0, 0.1, 0.1, 5, 0, 30),
    "linear": (1, 0.1, 0.0, 5, 20, 30),
    "linear_min": (1, 0.1, 0.01, 3, 20, 30),
    "cosine": (2, 6e-4, 6e-5, 10, 50, 60),
    "cosine_nowarm": (2, 0.1, 0.0, 0, 25, 30),
}
for name, (kind, base, mn, W, T, N) in SCHEDS.items():
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=base)
    sch = torch.optim.lr_scheduler.LambdaLR(opt, lam(kind, base, mn, W, T))
    lrs = []
    for _ in range(N):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sch.step()
    out["sched.%s.cfg" % name] = torch.tensor([kind, base, mn, W, T], dtype=torch.float64)
    out["sched.%s.lr" % name] = torch.tensor(lrs, dtype=torch.float64)

# CosineAnnealingLR (its recursive form) for the no-warmup cosine, steps 0..T_max
p = torch.zeros(1, requires_grad=True)
opt = torch.optim.SGD([p], lr=0.1)
sch = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=25, eta_min=1e-3)
lrs = []
for _ in range(26):
    lrs.append(opt.param_groups[0]["lr"])
    opt.step()
    sch.step()
out["sched.annealing.cfg"] = torch.tensor([2, 0.1, 1e-3, 0, 25], dtype=torch.float64)
out["sched.annealing.lr"] = torch.tensor(lrs, dtype=torch.float64)


# ---- GradScaler.update: torch 1.13 has no CPU kernel for torch._amp_update_scale_, so this
# is its CUDA kernel (aten/src/ATen/native/cuda/AmpKernels.cu) on float32 / int32 values:
#   if found_inf: scale = scale * backoff; tracker = 0
#   else: successful = tracker + 1
#         if successful == growth_interval: new = float(scale * growth); if finite: scale = new; tracker = 0
#         else: tracker = successful
def scaler_seq(found, init_scale=65536.0, growth=2.0, backoff=0.5, interval=3):
    scale = torch.tensor(init_scale, dtype=torch.float32)
    tracker = 0
    scales, trackers = [], []
    for f in found:
        if f:
            scale = (scale.double() * backoff).float()
            tracker = 0
        else:
            if tracker + 1 == interval:
                new = (scale.double() * growth).float()
                if torch.isfinite(new):
                    scale = new
                tracker = 0
            else:
                tracker += 1
        scales.append(float(scale))
        trackers.append(tracker)
    return scales, trackers


found = [0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]
scales, trackers = scaler_seq(found)
out["scaler.found_inf"] = torch.tensor(found, dtype=torch.uint8)
out["scaler.scale"] = torch.tensor(scales, dtype=torch.float32)
out["scaler.tracker"] = torch.tensor(trackers, dtype=torch.int32)

root = os.path.join(os.path.dirname(__file__), "..", "fixtures", "optim")
os.makedirs(root, exist_ok=True)
path = os.path.join(root, "optim.safetensors")
st.save(path, out, metadata={"source": "torch " + torch.__version__, "steps": str(STEPS)})
print("wrote", os.path.normpath(path), os.path.getsize(path), "bytes")
