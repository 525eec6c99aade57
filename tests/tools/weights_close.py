#!/usr/bin/env python3
"""weights_close.py A.safetensors B.safetensors [rtol] [--normwise]: exit 0 when every f32
tensor of A equals B's within rtol relative to the tensor's largest magnitude (default 1e-5);
prints the worst difference. --normwise: instead, the whole model's ||A - B|| / ||A|| within
rtol. Standard library only (the test machines need no numpy)."""
import json, struct, sys


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in head.items():
        if k == "__metadata__" or v["dtype"] != "F32":
            continue
        a, b = v["data_offsets"]
        out[k] = struct.unpack("<%df" % ((b - a) // 4), data[a:b])
    return out


args = [x for x in sys.argv[1:] if x != "--normwise"]
a, b = load(args[0]), load(args[1])
rtol = float(args[2]) if len(args) > 2 else 1e-5
if sorted(a) != sorted(b) or not a:
    sys.exit("tensor names differ: %s vs %s" % (sorted(a)[:5], sorted(b)[:5]))
if "--normwise" in sys.argv:
    num = sum((x - y) ** 2 for k in a for x, y in zip(a[k], b[k]))
    e = (num / max(sum(x * x for k in a for x in a[k]), 1e-300)) ** 0.5
    print("normwise difference %.3g" % e)
    sys.exit(0 if e <= rtol else 1)
worst, where = 0.0, ""
for k in a:
    scale = max(max(abs(x) for x in a[k]), 1e-30)
    d = max(abs(x - y) for x, y in zip(a[k], b[k])) / scale
    if d > worst:
        worst, where = d, k
print("largest relative difference %.3g (%s)" % (worst, where or "all equal"))
sys.exit(0 if worst <= rtol else 1)
