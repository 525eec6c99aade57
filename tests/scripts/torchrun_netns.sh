#!/usr/bin/env bash
# torchrun --nnodes 2 across two "hosts" (network namespaces joined by a veth pair, subnet
# 10.79.0.0/24), 2 workers per host, `ctrain train cnn` for 200 steps: the ranks of node 1
# join the c10d store of node 0's agent at 10.79.0.1, and the final weights equal a one-host
# 4-rank `ctrain run` within 1e-5 relative (the ranks meet through the hier backend: shm on each
# host, gloo between the two). Debian's torchrun (PyTorch 1.13) always; a
# PyTorch >= 2 (PYTHON=, else /tmp/gpt2-venv) where installed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
C=$PWD/${CT_BUILD:-build}/ctrain
skip() { echo "$*"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
. tests/tools/fashion_mnist.sh
/usr/bin/python3 -c "import torch.distributed.run" 2>/dev/null ||
    skip "Debian's python3-torch (torchrun) not installed (scripts/setup-interop.sh)"
tmp=$(mktemp -d) d=$tmp
TWO_HOSTS_NET=10.79.0 # beside the other two-host tests
. tests/tools/two_hosts.sh # namespaces $A and $Bn joined by a veth
export CTRAIN_BIND=0 OMP_NUM_THREADS=1
common=(cnn --steps ${STEPS:-200} --log-every 50 --eval-max 500 --threads 1)
"$C" run --nproc-per-node 4 --standalone "$C" train "${common[@]}" --output-dir "$d/ref" > "$d/ref.log" 2>&1 ||
    { cat "$d/ref.log"; die "one-host 4-rank reference"; }
same() { cmp -s "$1" "$2" || /usr/bin/python3 tests/tools/weights_close.py "$1" "$2" 1e-5; }
port=47960
two_nodes() { # NAME PYTHON
    local name=$1 py=$2 k pids=()
    port=$((port + 1))
    for k in 0 1; do
        local ns=$A; [ $k = 1 ] && ns=$Bn
        timeout 600 ip netns exec $ns "$py" -m torch.distributed.run --no_python --redirects 2 --tee 2 \
            --nnodes 2 --node_rank $k --master_addr 10.79.0.1 --master_port $port --nproc_per_node 2 \
            "$C" train "${common[@]}" --output-dir "$d/$name-node$k" > "$d/$name-node$k.log" 2>&1 &
        pids+=($!)
    done
    for k in 0 1; do wait ${pids[$k]} || { cat "$d/$name-node$k.log"; die "$name: node $k failed"; }; done
    grep -q "4 ranks × batch 64" "$d/$name-node0.log" || { cat "$d/$name-node0.log"; die "$name: not a 4-rank job"; }
    same "$d/ref/model.safetensors" "$d/$name-node0/model.safetensors" || die "$name: weights differ from one host's"
    echo "$name: 2 nodes x 2 ranks across namespaces equal to one host's 4 ranks"
}
two_nodes "torchrun-$(/usr/bin/python3 -c 'import torch; print(torch.__version__)')" /usr/bin/python3
. tests/tools/torch2.sh
if [ -n "$v2" ]; then two_nodes "torchrun-$v2" "$py2"; else echo "$no_torch2"; fi
echo ok
