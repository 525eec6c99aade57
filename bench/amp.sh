#!/usr/bin/env bash
# Mixed precision, ctrain vs PyTorch (docs/bench/amp.md): tokens/s and peak memory of the
# 6 x 256 GPT (fused attention / SDPA, 2048 tokens a step) in f32 and under bf16 autocast
# (`--amp bf16` / torch.autocast("cpu", bfloat16)), interleaved, ROUNDS times, one process each.
#   PYTHON=/path/to/python-with-torch-2 bash bench/amp.sh [THREADS] [SECONDS] [ROUNDS] [T]
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
TH=${1:-1}; SECS=${2:-5}; ROUNDS=${3:-2}; T=${4:-256}
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
    for v in flash flash,amp=bf16; do
        build/bench/train_bench single gpt "$TH" "$SECS" "$v,T=$T" | grep RESULT
        "$PY" bench/torch_gpt_savers.py "$TH" "$SECS" "$v,T=$T" | grep RESULT
    done
done
