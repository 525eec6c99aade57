#!/usr/bin/env bash
# examples/ddp_minimal.c runs under `ctrain run` (torchrun style) and under ct_spawn
# (mp.spawn style) and its loss goes down.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ ! -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] && [ -z "${CTRAIN_DATA_DIR:-}" ]; then
    echo "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"; exit 77
fi
check() {
    local out=$1
    echo "$out" | grep -q "epoch 1: mean loss" || { echo "$out"; exit 1; }
    local l0 l1
    l0=$(echo "$out" | sed -n 's/epoch 0: mean loss \([0-9.]*\).*/\1/p')
    l1=$(echo "$out" | sed -n 's/epoch 1: mean loss \([0-9.]*\).*/\1/p')
    awk -v a="$l0" -v b="$l1" 'BEGIN { exit !(b < a) }' || { echo "loss did not go down: $l0 -> $l1"; exit 1; }
}
check "$(${CT_BUILD:-build}/ctrain run --standalone --nproc-per-node 2 ${CT_BUILD:-build}/examples/ddp_minimal 2>&1)"
check "$(${CT_BUILD:-build}/examples/ddp_minimal --spawn 2 2>&1)"
echo ok
