"""Minimal safetensors reader/writer for the reference scripts (no `safetensors` package here).

    import st
    st.save("out.safetensors", {"w": torch.randn(3, 4)}, metadata={"format": "pt"})
    tensors = st.load("out.safetensors")            # {name: torch.Tensor}
    tensors, meta = st.load_with_metadata("out.safetensors")

Same layout as the Hugging Face library: 8-byte little-endian header length, JSON header
padded with spaces to a multiple of 8, tensors ordered by decreasing item size then name.
"""
import json
import struct
import sys

import torch

assert sys.byteorder == "little", "safetensors data is little-endian"

DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}
NAMES = {v: k for k, v in DTYPES.items()}


def _bytes(t):
    t = t.detach().cpu().contiguous()
    if t.numel() == 0:
        return b""
    # numpy has no bfloat16: go through a same-size integer view
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def save(path, tensors, metadata=None):
    items = sorted(tensors.items(), key=lambda kv: (-kv[1].element_size(), kv[0]))
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in items:
        b = _bytes(t)
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_with_metadata(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        dt = NAMES[info["dtype"]]
        shape = info["shape"]
        if e == b:
            out[name] = torch.zeros(shape, dtype=dt)
        else:
            out[name] = torch.frombuffer(bytearray(data[b:e]), dtype=dt).reshape(shape).clone()
    return out, meta


def load(path):
    return load_with_metadata(path)[0]
