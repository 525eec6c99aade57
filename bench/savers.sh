#!/usr/bin/env bash
# GPT memory savers, ctrain vs PyTorch side by side (docs/bench/gpt.md): tokens/s and peak
# memory of the 6 x 256 GPT at context 256 / 1024 / 2048 (2048 tokens a step), plain, fused
# attention (flash: ctrain's ct_flash_attention, PyTorch's F.scaled_dot_product_attention)
# and activation checkpointing per block, interleaved, one process each.
#   PYTHON=/path/to/python-with-torch-2 bash bench/savers.sh [THREADS] [SECONDS]
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
TH=${1:-1}; SECS=${2:-5}
"$PY" -c 'import torch, torch.nn.functional as F; assert hasattr(F, "scaled_dot_product_attention")' 2>/dev/null ||
    { echo "savers: PYTHON=$PY has no PyTorch >= 2 (scaled_dot_product_attention)" >&2; exit 1; }
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), family $(grep -m1 'cpu family' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg), torch $("$PY" -c 'import torch; print(torch.__version__)')"
for T in 256 1024 2048; do
    for v in plain flash ckpt flash,ckpt; do
        build/bench/train_bench single gpt "$TH" "$SECS" "$v,T=$T" | grep RESULT
        [ "$v" = "flash,ckpt" ] && continue
        "$PY" bench/torch_gpt_savers.py "$TH" "$SECS" "$v,T=$T" | grep RESULT
    done
done
