#!/usr/bin/env bash
# Two "hosts" (network namespaces joined by a veth pair on 10.75.0.0/24, tests/tools/two_hosts.sh),
# 2 ranks on each, 1 thread per rank:
#  - DDP training throughput, MLP (784-1024-1024-10, batch 128/rank, SGD momentum) and GPT
#    (6 layers, width 256, 8 heads, context 256, vocab 256, batch 8/rank, AdamW): ctrain
#    (`ctrain run --nnodes 2 --nproc-per-node 2 ... ctrain train`, hier backend: shm inside a
#    host, Gloo between the two leaders) against PyTorch DDP, gloo backend, under its own
#    `torchrun --nnodes 2` (bench/torch_train.py torchrun);
#  - all-reduce bus bandwidth at 16, 32, 64 MiB: ctrain hier (ctrain run --nnodes; its default
#    ordered all-reduce, and hier-rail: CTRAIN_HIER_ALLREDUCE=rail), ctrain flat
#    gloo (--backend gloo), ctrain flat Open MPI (mpirun, --backend mpi) and PyTorch's
#    torch.distributed gloo all_reduce (torchrun --nnodes 2, bench/gloo_allreduce.py).
# The configurations alternate for ROUNDS rounds (default 1); every result of every round is
# printed. Rates are global (all 4 ranks). ctrain's training rate is that of its step lines
# after the first log interval (warm-up), PyTorch's is measured after its warm-up steps.
# Both "hosts" share this machine's cores: CTRAIN_SHM_SPIN_US=2 keeps ctrain's shm waits from
# spinning on a core a peer needs (as bench/hier_netns.sh).
# Usage: [PYTHON=/tmp/gpt2-venv/bin/python] [ROUNDS=N] [TRAIN_MODELS="mlp gpt"] bench/multinode.sh
# (TRAIN_MODELS= : the all-reduce figures alone)
set -u
cd "$(dirname "$0")/.." || exit 1
C=$PWD/${CT_BUILD:-build}/ctrain
PY=${PYTHON:-/tmp/gpt2-venv/bin/python}
skip() { echo "$*"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
command -v mpirun >/dev/null || skip "mpirun not installed"
nm ${CT_BUILD:-build}/libctrain.a 2>/dev/null | grep -q "T ct_gloo_create" || skip "built without Gloo (apt-get install libgloo-dev)"
"$PY" -c "import torch.distributed.run" 2>/dev/null || skip "no PyTorch with torchrun at PYTHON=$PY"
data=${CTRAIN_DATA_DIR:-/usr/share/datasets/fashion-mnist}
[ -r "$data/train-images-idx3-ubyte.gz" ] || skip "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"
text=${TEXT:-/usr/share/common-licenses/GPL-3}
tmp=$(mktemp -d)
TWO_HOSTS_NET=${TWO_HOSTS_NET:-10.75.0}
. tests/tools/two_hosts.sh
export CTRAIN_SHM_SPIN_US=2
port=${PORT:-29750}
secret=$tmp/secret # the store's secret, in a 0600 file: never on a command line
od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$secret"; chmod 600 "$secret"

# both nodes of a 2 x 2 job; LOG.0 and LOG.1 get their output; the rest is the command
ctrain_2x2() {
    local log=$1 k pids=(); shift
    port=$((port + 1))
    for k in 0 1; do
        ip netns exec "$([ $k = 0 ] && echo $A || echo $Bn)" timeout 600 "$C" run --nnodes 2 --nproc-per-node 2 \
            --node-rank $k --master-addr $net.1 --master-port $port --rdzv-token-file "$secret" "$@" >"$log.$k" 2>&1 &
        pids+=($!)
    done
    wait ${pids[0]} && wait ${pids[1]}
}
torch_2x2() {
    local log=$1 k ns pids=(); shift
    port=$((port + 1))
    for k in 0 1; do
        ns=$A; [ $k = 1 ] && ns=$Bn
        ip netns exec $ns env GLOO_SOCKET_IFNAME=v$ns OMP_NUM_THREADS=1 timeout 600 "$PY" -m torch.distributed.run \
            --nnodes 2 --node-rank $k --nproc-per-node 2 --master-addr $net.1 --master-port $port "$@" \
            >"$log.$k" 2>&1 &
        pids+=($!)
    done
    wait ${pids[0]} && wait ${pids[1]}
}
# global rate from ctrain's step lines, the first interval left out: harmonic mean of the rest
ctrain_rate() {
    grep -E '^step ' "$1" | sed -E 's/.*\| ([0-9.]+) (samples|tokens)\/s.*/\1/' | tail -n +2 |
        awk '{ s += 1 / $1; n++ } END { if (n) printf "%.0f", n / s; else print "?" }'
}

gpt=(--n-layer 6 --n-embd 256 --n-head 8 --block-size 256 --vocab-size 256 --batch-size 8 --text "$text"
     --steps ${GPT_STEPS:-12} --log-every 3)
mlp=(--hidden 1024,1024 --batch-size 128 --data-dir "$data" --steps ${MLP_STEPS:-80} --log-every 20)
common=(--threads 1 --eval-max 16)
sizes=(16777216 33554432 67108864)
echo "# $(date -u '+%F %H:%M UTC') | $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores |" \
     "load $(cut -d' ' -f1-3 /proc/loadavg) | torch $("$PY" -c 'import torch; print(torch.__version__)')"
for r in $(seq 1 "${ROUNDS:-1}"); do
    for m in ${TRAIN_MODELS-mlp gpt}; do
        eval "margs=(\"\${$m[@]}\")"
        ctrain_2x2 "$tmp/c$m" "$C" train $m "${margs[@]}" "${common[@]}" --output-dir "$tmp/out-$m-$r" ||
            die "ctrain $m: $(tail -5 "$tmp/c$m.0" "$tmp/c$m.1")"
        grep -q "4 ranks" "$tmp/c$m.0" || die "ctrain $m: not a 4-rank job: $(head -3 "$tmp/c$m.0")"
        cr=$(ctrain_rate "$tmp/c$m.0")
        torch_2x2 "$tmp/t$m" bench/torch_train.py torchrun $m 0 "${TORCH_SECONDS:-15}" ||
            die "torch $m: $(tail -5 "$tmp/t$m.0" "$tmp/t$m.1")"
        tl=$(grep RESULT "$tmp/t$m.0") || die "torch $m: no result: $(tail -5 "$tmp/t$m.0")"
        tr=$(echo "$tl" | sed -E 's/.* rate=([0-9.]+) .*/\1/' | awk '{ printf "%.0f", 4 * $1 }')
        unit=samples/s; [ $m = gpt ] && unit=tokens/s
        printf "round %d train %-4s %-10s ctrain %8s  pytorch %8s  ratio %s  (load %s)\n" "$r" $m $unit "$cr" "$tr" \
            "$(awk -v a="$cr" -v b="$tr" 'BEGIN { printf "%.2f", a / b }')" "$(cut -d' ' -f1 /proc/loadavg)"
    done
    ab=(-b 16M -e 64M -f 2 -n ${AR_ITERS:-10} -w 3)
    for b in hier hier-rail gloo; do
        mode=ordered; [ $b = hier-rail ] && mode=rail
        CTRAIN_HIER_ALLREDUCE=$mode ctrain_2x2 "$tmp/a$b" "$C" bench allreduce --backend ${b%-rail} "${ab[@]}" ||
            die "$b: $(tail -5 "$tmp/a$b.0" "$tmp/a$b.1")"
        grep -E '^ *[0-9]+ ' "$tmp/a$b.0" | awk -v c="ctrain-$b" -v r=$r '{ print r, c, $1, $7 }' >>"$tmp/ar"
    done
    mpi_2x2 -x CTRAIN_SHM_SPIN_US=2 "$C" bench allreduce --backend mpi "${ab[@]}" >"$tmp/ampi" 2>&1 ||
        die "mpi: $(tail -5 "$tmp/ampi")"
    grep -E '^ *[0-9]+ ' "$tmp/ampi" | awk -v r=$r '{ print r, "openmpi", $1, $7 }' >>"$tmp/ar"
    torch_2x2 "$tmp/atorch" bench/gloo_allreduce.py 0 "${sizes[@]}" || die "torch gloo: $(tail -5 "$tmp/atorch.0")"
    grep '^gloo ' "$tmp/atorch.0" | awk -v r=$r '{ print r, "pytorch-gloo", $2, $4 }' >>"$tmp/ar"
done
echo "# all-reduce busbw GB/s (f32 sum, 4 ranks, 2 per namespace), round: values | load $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%10s" "bytes"; for c in ctrain-hier ctrain-hier-rail ctrain-gloo openmpi pytorch-gloo; do printf "%20s" $c; done; echo
for s in "${sizes[@]}"; do
    printf "%10s" $s
    for c in ctrain-hier ctrain-hier-rail ctrain-gloo openmpi pytorch-gloo; do
        printf "%20s" "$(awk -v c=$c -v s=$s '$2 == c && $3 == s { printf "%s%s", sep, $4; sep = "," }' "$tmp/ar")"
    done
    echo
done
