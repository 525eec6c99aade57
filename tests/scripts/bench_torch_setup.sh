#!/usr/bin/env bash
# bench/run.sh's reference PyTorch: without PYTHON= it would create a virtual environment and
# pip-install the current torch from PyPI into it (checked with --setup-dry-run: the commands
# are printed, nothing is created or downloaded); PYTHON= naming an interpreter without torch
# is refused with a clear message (by bench/demo.sh too); bench/report.py keeps the two GPT
# attention variants apart.
set -u
cd "$(dirname "$0")/../.."
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

out=$(env -u PYTHON BENCH_VENV="$d/venv" bash bench/run.sh --setup-dry-run 2>&1) || fail "dry run exited $?: $out"
grep -q "would run: /usr/bin/python3 -m venv $d/venv" <<<"$out" || fail "no venv step: $out"
grep -q "would run: $d/venv/bin/python -m pip install --quiet torch" <<<"$out" || fail "no pip install torch step: $out"
[ ! -e "$d/venv" ] || fail "the dry run created $d/venv"

out=$(TORCH_PIP_SPEC='torch==2.15.0' env -u PYTHON BENCH_VENV="$d/venv" bash bench/run.sh --setup-dry-run 2>&1) || fail "dry run with TORCH_PIP_SPEC: $out"
grep -q "pip install --quiet torch==2.15.0" <<<"$out" || fail "TORCH_PIP_SPEC not used: $out"

out=$(PYTHON=/bin/false bash bench/run.sh --setup-dry-run 2>&1) && fail "PYTHON without torch accepted: $out"
grep -q "PYTHON=/bin/false cannot import torch" <<<"$out" || fail "unclear message for PYTHON without torch: $out"

# bench/demo.sh (the README's demo vs torchrun) takes the same reference
out=$(PYTHON=/bin/false bash bench/demo.sh 2>&1) && fail "demo.sh: PYTHON without torch accepted: $out"
grep -q "PYTHON=/bin/false cannot import torch" <<<"$out" || fail "demo.sh: unclear message for PYTHON without torch: $out"

out=$(bash bench/run.sh --no-such-option 2>&1) && fail "unknown option accepted"
grep -q "unknown option --no-such-option" <<<"$out" || fail "unclear message for an unknown option: $out"
# bench/report.py: the fused-attention GPT (model=gptf, tagged by run.sh after train_bench's
# model=gpt) gets rows of its own, never mixed into the explicit-attention GPT's
r="$d/results.txt"
{
    echo 'MACHINE cpu="Test CPU" family=6 model=1 cores=2 load="0 0 0" date=2026-01-01T00:00:00Z'
    echo 'RESULT impl=ctrain model=sgemm threads=1 gflops=100.0'
    echo 'RESULT impl=ctrain model=gpt threads=1 ranks=1 rate=3000.0 unit=tokens/s peak_rss_mb=500 flops_per_step=6.951e+10 attention=plain'
    echo 'RESULT impl=ctrain model=gpt threads=1 ranks=1 rate=4000.0 unit=tokens/s peak_rss_mb=400 flops_per_step=6.951e+10 attention=flash omp_wait=default model=gptf'
    echo 'RESULT impl=pytorch model=gpt threads=1 ranks=1 rate=2500.0 unit=tokens/s peak_rss_mb=1500 flops_per_step=6.951e+10 torch=9.9'
    echo 'RESULT impl=pytorch model=gptf threads=1 ranks=1 rate=3200.0 unit=tokens/s peak_rss_mb=1000 flops_per_step=6.951e+10 torch=9.9'
} >"$r"
out=$(python3 bench/report.py "$r" 2>&1) || fail "report.py: $out"
grep -q '^| GPT (tokens/s) | 1 | 3,000 | 2,500 | 1.20× |' <<<"$out" || fail "report.py: no explicit-attention GPT row: $out"
grep -q '^| GPT fused attention (tokens/s) | 1 | 4,000 | 3,200 | 1.25× |' <<<"$out" || fail "report.py: no fused-attention GPT row: $out"

echo "bench report rows and reference setup: dry run, TORCH_PIP_SPEC, bad PYTHON, bad option all as expected"
