#!/usr/bin/env bash
# bench/run.sh's reference PyTorch: without PYTHON= it would create a virtual environment and
# pip-install the current torch from PyPI into it (checked with --setup-dry-run: the commands
# are printed, nothing is created or downloaded); PYTHON= naming an interpreter without torch
# is refused with a clear message (by bench/demo.sh too).
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
echo "bench reference setup: dry run, TORCH_PIP_SPEC, bad PYTHON, bad option all as expected"
