#!/usr/bin/env bash
# The GPU commands where there is no GPU: `ctrain run --nproc-per-node gpu` fails with one
# line saying why (and starts nothing), `ctrain env --check` says the NCCL check did not
# run and why (exit 0: what exists passed), and `ctrain bench allreduce --backend nccl`
# fails naming the backend's need for a GPU. On a machine with a GPU these paths are not
# the ones taken: skipped there (tests/gpu and scripts/gpu-check.sh cover it).
set -uo pipefail
cd "$(dirname "$0")/../.."
ct=${CT_BUILD:-build}/ctrain
if $ct env | grep -qE "^cuda: +[0-9]+ GPUs? visible"; then
    echo "skip: a CUDA GPU is visible here (scripts/gpu-check.sh covers this machine)"
    exit 77
fi
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

err=$($ct run --nproc-per-node gpu -- touch "$tmp/started" 2>&1); rc=$?
[ $rc -ne 0 ] || fail "run --nproc-per-node gpu succeeded without a GPU: $err"
[ "$(echo "$err" | wc -l)" -eq 1 ] || fail "run --nproc-per-node gpu: more than one line: $err"
echo "$err" | grep -q "^ctrain run: --nproc-per-node gpu: no CUDA GPU usable here (.\+)$" || fail "run: unclear message: $err"
[ ! -e "$tmp/started" ] || fail "run --nproc-per-node gpu started a worker"
echo "run:   $err"

out=$($ct env --check 2>&1) || fail "env --check failed without a GPU: $out"
line=$(echo "$out" | grep "^gpu check:") || fail "env --check: no 'gpu check:' line: $out"
echo "$line" | grep -qE "^gpu check: not run: (no CUDA GPU usable here \(.+\)|this build has no CUDA)$" || fail "env --check: $line"
echo "env:   $line"

err=$($ct bench allreduce --backend nccl -b 1M -e 1M 2>&1); rc=$?
[ $rc -ne 0 ] || fail "bench --backend nccl succeeded without a GPU: $err"
echo "$err" | grep -qiE "nccl.*(GPU|not built|CUDA)" || fail "bench --backend nccl: unclear message: $err"
echo "bench: $(echo "$err" | head -1)"
echo ok
