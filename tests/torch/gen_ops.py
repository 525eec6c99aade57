"""Writes tests/fixtures/ops/ops.safetensors, the PyTorch references for every op in
include/ctrain/ops.h, read by tests/unit/test_ops_torch.c (run with /usr/bin/python3):

    /usr/bin/python3 tests/torch/gen_ops.py

One case per entry below, named "<op>#<k>" (op = the name in ops.h without "ct_"):
  <case>.x0 .. .x3   inputs (f32; class indices / token ids as I64 or I32). An optional input
                     that is absent (a NULL bias) is simply not stored.
  <case>.args        F64 vector of the op's scalar arguments (see ARGS below, same order as
                     the C call)
  <case>.y           output, f32, contiguous (views are stored as their contiguous copy)
  <case>.gy          the upstream gradient fed to backward (fixed random, shape of y)
  <case>.g0 .. .g3   gradient of each float input: d(sum(y * gy)) / d x_i
  <case>.y_64, .g<i>_64  the same computed by PyTorch in float64 (stored rounded to f32): the
                     exact answer, to tell PyTorch's own f32 rounding error from ours
Everything is computed by PyTorch in float32 on the CPU, as a PyTorch user would get it.
Dropout is random by design: test_ops_torch.c checks it by statistics, not here.
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import st  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ops", "ops.safetensors")

torch.manual_seed(1234)
torch.set_num_threads(1)

tensors = {}
counts = {}


def randn(*shape, scale=1.0):
    return torch.randn(tuple(shape), dtype=torch.float32) * scale


def case(op, inputs, fn, args=()):
    """inputs: list of tensors or None (absent optional input); fn(*inputs) -> output."""
    k = counts.get(op, 0)
    counts[op] = k + 1
    name = f"{op}#{k}"
    leaves = []
    for t in inputs:
        if t is None or not t.is_floating_point():
            leaves.append(t)
        else:
            leaves.append(t.detach().clone().requires_grad_(True))
    y = fn(*leaves)
    gy = randn(*y.shape)
    y.backward(gy)
    # the same in float64: the exact answer (to f32 rounding), to tell PyTorch's own f32
    # rounding from ours
    leaves64 = [None if t is None else (t.detach().double().requires_grad_(True) if t.is_floating_point() else t)
                for t in inputs]
    y64 = fn(*leaves64)
    y64.backward(gy.double())
    for i, (t, leaf) in enumerate(zip(inputs, leaves64)):
        if t is not None and t.is_floating_point():
            tensors[f"{name}.g{i}_64"] = leaf.grad.detach().float().contiguous()
    tensors[f"{name}.y_64"] = y64.detach().float().contiguous()
    for i, (t, leaf) in enumerate(zip(inputs, leaves)):
        if t is None:
            continue
        tensors[f"{name}.x{i}"] = t.detach().contiguous()
        if t.is_floating_point():
            tensors[f"{name}.g{i}"] = leaf.grad.detach().contiguous()
    tensors[f"{name}.y"] = y.detach().contiguous()
    tensors[f"{name}.gy"] = gy
    tensors[f"{name}.args"] = torch.tensor([float(a) for a in args] or [0.0], dtype=torch.float64)


# ---- views ----
case("reshape", [randn(2, 3, 4)], lambda x: x.reshape(4, 6), [4, 6])
case("reshape", [randn(3, 5, 7)], lambda x: x.reshape(-1), [105])
case("flatten", [randn(2, 3, 4, 5)], lambda x: torch.flatten(x, 1), [1])
case("flatten", [randn(2, 3, 5)], lambda x: torch.flatten(x, 0), [0])
case("transpose", [randn(2, 3, 4)], lambda x: x.transpose(0, 2), [0, 2])
case("transpose", [randn(3, 5, 7)], lambda x: x.transpose(1, 2), [1, 2])
case("slice", [randn(5, 6)], lambda x: x[:, 2:5], [1, 2, 3])
case("slice", [randn(7, 3, 2)], lambda x: x[1:6], [0, 1, 5])
case("contiguous", [randn(3, 4)], lambda x: x.contiguous(), [])

# ---- linear algebra ----
for ta in (0, 1):
    for tb in (0, 1):
        M, K, N = 5, 7, 3
        a = randn(K, M) if ta else randn(M, K)
        b = randn(N, K) if tb else randn(K, N)
        case("matmul", [a, b], lambda a, b, ta=ta, tb=tb: (a.t() if ta else a) @ (b.t() if tb else b), [ta, tb])
        a = randn(2, K, M) if ta else randn(2, M, K)
        b = randn(2, N, K) if tb else randn(2, K, N)
        case("matmul", [a, b], lambda a, b, ta=ta, tb=tb: (a.transpose(1, 2) if ta else a) @ (b.transpose(1, 2) if tb else b), [ta, tb])
case("matmul", [randn(33, 65), randn(65, 17)], lambda a, b: a @ b, [0, 0])
case("linear", [randn(4, 7), randn(5, 7), randn(5)], F.linear)
case("linear", [randn(2, 3, 7), randn(5, 7), None], lambda x, w, b: F.linear(x, w))
case("linear", [randn(17, 129), randn(31, 129), randn(31)], F.linear)

# ---- elementwise ----
case("add", [randn(3, 5), randn(3, 5)], torch.add)
case("add", [randn(2, 3, 4), randn(4)], torch.add)
case("add", [randn(2, 3, 4), randn(3, 4)], torch.add)
case("mul", [randn(3, 5), randn(3, 5)], torch.mul)
case("mul", [randn(2, 7, 9), randn(2, 7, 9)], torch.mul)
case("scale", [randn(4, 5)], lambda x: x * -1.7, [-1.7])
case("scale", [randn(3, 33)], lambda x: x * 0.125, [0.125])
case("bias_add", [randn(2, 3, 4, 5), randn(3)], lambda x, b: x + b.view(1, 3, 1, 1))
case("bias_add", [randn(5, 7), randn(7)], lambda x, b: x + b)
case("relu", [randn(5, 7)], F.relu)
case("relu", [randn(2, 3, 17)], F.relu)
for approx in (0, 1):
    case("gelu", [randn(6, 33, scale=3)], lambda x, a=approx: F.gelu(x, approximate="tanh" if a else "none"), [approx])
    case("gelu", [randn(3, 4, 5)], lambda x, a=approx: F.gelu(x, approximate="tanh" if a else "none"), [approx])
case("tanh", [randn(6, 33, scale=3)], torch.tanh)
case("tanh", [randn(2, 5, 7, scale=0.1)], torch.tanh)
case("sigmoid", [randn(6, 33, scale=4)], torch.sigmoid)
case("sigmoid", [randn(3, 7)], torch.sigmoid)

# ---- reductions, normalisation, losses ----
case("sum", [randn(3, 5, 7)], torch.sum)
case("sum", [randn(1000)], torch.sum)
case("mean", [randn(3, 5, 7)], torch.mean)
case("mean", [randn(37, 11)], torch.mean)
case("softmax", [randn(4, 7)], lambda x: F.softmax(x, -1))
case("softmax", [randn(2, 3, 33, scale=5)], lambda x: F.softmax(x, -1))
case("softmax", [randn(3, 1)], lambda x: F.softmax(x, -1))
case("softmax", [randn(2, 257, scale=10)], lambda x: F.softmax(x, -1))
case("log_softmax", [randn(4, 7)], lambda x: F.log_softmax(x, -1))
case("log_softmax", [randn(2, 3, 33, scale=5)], lambda x: F.log_softmax(x, -1))
case("log_softmax", [randn(2, 257, scale=10)], lambda x: F.log_softmax(x, -1))
t = torch.tensor([2, 0, -100, 4, 4, 1], dtype=torch.int64)
case("cross_entropy", [randn(6, 5), t], lambda x, t: F.cross_entropy(x, t, ignore_index=-100), [-100])
t = torch.randint(0, 11, (9,), dtype=torch.int32)
case("cross_entropy", [randn(9, 11, scale=3), t], lambda x, t: F.cross_entropy(x, t.long(), ignore_index=-100), [-100])
t = torch.tensor([3, 1, 3, 0, 2, 3, 1], dtype=torch.int64)
case("cross_entropy", [randn(7, 4), t], lambda x, t: F.cross_entropy(x, t, ignore_index=3), [3])
t = torch.randint(0, 65, (37,), dtype=torch.int64)
case("cross_entropy", [randn(37, 65, scale=4), t], lambda x, t: F.cross_entropy(x, t), [-100])
case("mse_loss", [randn(4, 5), randn(4, 5)], F.mse_loss)
case("mse_loss", [randn(3, 7, 2), randn(3, 7, 2)], F.mse_loss)
for w, b, eps in ((1, 1, 1e-5), (1, 0, 1e-5), (0, 1, 1e-3), (0, 0, 1e-5)):
    D = 7
    x = randn(2, 3, D, scale=2) + 0.5
    wt = randn(D) if w else None
    bt = randn(D) if b else None
    case("layer_norm", [x, wt, bt], lambda x, w, b, eps=eps: F.layer_norm(x, (x.shape[-1],), w, b, eps), [eps, w, b])
case("layer_norm", [randn(5, 256, scale=3) + 1, randn(256), randn(256)],
     lambda x, w, b: F.layer_norm(x, (256,), w, b, 1e-5), [1e-5, 1, 1])

# ---- embeddings, convolution, pooling ----
idx = torch.tensor([[3, 0, 3, 9, 1], [3, 3, 7, 0, 2]], dtype=torch.int64)
# embedding's C signature is (w, idx): x0 = w, x1 = idx
case("embedding", [randn(10, 4), idx], lambda w, i: F.embedding(i, w))
idx = torch.tensor([5, 0, 6, 6, 1, 5], dtype=torch.int32)
case("embedding", [randn(7, 3), idx], lambda w, i: F.embedding(i.long(), w))
conv = [  # x, w, bias?, stride, padding
    ((2, 3, 7, 6), (4, 3, 3, 3), 1, 1, 1),
    ((2, 3, 7, 6), (4, 3, 3, 3), 0, 2, 0),
    ((2, 3, 5, 5), (5, 3, 1, 1), 1, 1, 0),
    ((1, 3, 6, 7), (4, 3, 3, 2), 1, 2, 2),
    ((3, 1, 12, 12), (4, 1, 5, 5), 1, 1, 2),
]
for xs, ws, hb, s, p in conv:
    case("conv2d", [randn(*xs), randn(*ws, scale=0.5), randn(ws[0]) if hb else None],
         lambda x, w, b, s=s, p=p: F.conv2d(x, w, b, stride=s, padding=p), [s, p, hb])
pools = [(2, 2, 0), (3, 2, 1), (3, 1, 1), (2, 1, 0)]
for k, s, p in pools:
    case("max_pool2d", [randn(2, 3, 7, 6)], lambda x, k=k, s=s, p=p: F.max_pool2d(x, k, s, p), [k, s, p])
    case("avg_pool2d", [randn(2, 3, 7, 6)], lambda x, k=k, s=s, p=p: F.avg_pool2d(x, k, s, p, count_include_pad=True), [k, s, p])
# ties: the first maximum in scan order gets the gradient, as PyTorch
case("max_pool2d", [torch.round(randn(1, 2, 6, 6))], lambda x: F.max_pool2d(x, 3, 1, 1), [3, 1, 1])


# ---- attention ----
def split_heads(x, h):
    B, T, C = x.shape
    return x.view(B, T, h, C // h).transpose(1, 2)


def merge_heads(x):
    B, H, T, D = x.shape
    return x.transpose(1, 2).reshape(B, T, H * D)


def attention(q, k, v, causal):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:  # top-left aligned, like is_causal: query i sees keys j <= i
        Tq, Tk = s.shape[-2], s.shape[-1]
        mask = torch.ones(Tq, Tk, dtype=torch.bool).tril()
        s = s.masked_fill(~mask, float("-inf"))
    return F.softmax(s, -1) @ v


case("split_heads", [randn(2, 5, 12)], lambda x: split_heads(x, 3), [3])
case("split_heads", [randn(1, 3, 8)], lambda x: split_heads(x, 1), [1])
case("merge_heads", [randn(2, 3, 5, 4)], merge_heads)
for causal in (0, 1):
    case("attention", [randn(2, 3, 5, 4), randn(2, 3, 5, 4), randn(2, 3, 5, 4)],
         lambda q, k, v, c=causal: attention(q, k, v, c), [causal])
    case("attention", [randn(1, 2, 17, 8), randn(1, 2, 17, 8), randn(1, 2, 17, 8)],
         lambda q, k, v, c=causal: attention(q, k, v, c), [causal])
    case("attention", [randn(1, 2, 3, 4), randn(1, 2, 6, 4), randn(1, 2, 6, 5)],
         lambda q, k, v, c=causal: attention(q, k, v, c), [causal])

# long enough for the blocked causal path (query rows in blocks of ceil(T/4) when T >= 128)
case("attention", [randn(1, 1, 130, 8), randn(1, 1, 130, 8), randn(1, 1, 130, 8)],
     lambda q, k, v: attention(q, k, v, True), [1])
case("attention", [randn(1, 1, 128, 4), randn(1, 1, 160, 4), randn(1, 1, 160, 4)],
     lambda q, k, v: attention(q, k, v, True), [1])

os.makedirs(os.path.dirname(OUT), exist_ok=True)
st.save(OUT, tensors, metadata={"generator": "tests/torch/gen_ops.py", "torch": torch.__version__})
size = os.path.getsize(OUT)
print(f"{OUT}: {len(counts)} ops, {sum(counts.values())} cases, {len(tensors)} tensors, {size} bytes")
assert size < 2 << 20
