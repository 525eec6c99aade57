#!/usr/bin/env bash
# A safetensors file written by ctrain loads in PyTorch with the right values (read by
# tests/torch/st.py, the same layout the Hugging Face library reads). Skips without torch.
cd "$(dirname "$0")/../.." || exit 1
PY=/usr/bin/python3
if ! [ -x "$PY" ] || ! "$PY" -c "import torch" 2>/dev/null; then echo "no PyTorch at $PY (bash scripts/setup-interop.sh installs python3-torch)"; exit 77; fi
out=$(mktemp /tmp/ct_st_torch_XXXXXX.safetensors)
trap 'rm -f "$out"' EXIT
CT_ST_KEEP="$out" build/tests/test_safetensors roundtrip || exit 1
"$PY" - "$out" <<'PYEOF' || exit 1
import sys
sys.path.insert(0, "tests/torch")
import torch, st
t, meta = st.load_with_metadata(sys.argv[1])
i = lambda n, dt=torch.float64: torch.arange(n, dtype=dt)
want = {
    "model.w": (i(15, torch.float32) * torch.tensor(0.1, dtype=torch.float32) - torch.tensor(0.7, dtype=torch.float32)).reshape(3, 5),
    "f64": i(4) / 7.0,
    "half": (i(6) * 0.5 - 2).half().reshape(2, 3),
    "brain": (i(5) * 1.5 + 0.25).bfloat16(),
    "i32": (i(7, torch.int32) - 3) * 1000003,
    "i64": i(3, torch.int64) * (1 << 40) - 7,
    "u8": (i(5, torch.int64) + 251).to(torch.uint8),
    "i8": (i(4, torch.int64) - 128).to(torch.int8).reshape(2, 2),
    "scalar": torch.tensor(-2.5),
    "empty": torch.zeros(0, 3),
}
assert set(t) == set(want), sorted(t)
for k, v in want.items():
    assert t[k].dtype == v.dtype and t[k].shape == v.shape, (k, t[k].dtype, t[k].shape)
    assert torch.equal(t[k], v), (k, t[k], v)
assert meta == {"format": "pt", "step": "42", 'quote"d': "a\\b\n"}, meta
# and through a module's load_state_dict, as a user would
m = torch.nn.Linear(5, 3, bias=False)
m.load_state_dict({"weight": t["model.w"]})
assert torch.equal(m.weight.data, want["model.w"])
print("ctrain-written file loads in PyTorch")
PYEOF
