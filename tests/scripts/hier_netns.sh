#!/usr/bin/env bash
# The hierarchical backend across two "hosts" (network namespaces joined by a veth pair,
# 10.76.0.0/24), 2 ranks in each, launched by mpirun with no ctrain variables: `ctrain train
# cnn` picks hier (shm inside a namespace, MPI between the two leaders) by itself. Checks:
# final weights within 1e-5 relative of a one-host 4-rank `ctrain run`, the same bits on a
# second run, the leaders' gradients crossed the veth, and killing one namespace's workers
# fails the job within CTRAIN_TIMEOUT + 5 s with a message naming the host and rank.
set -u
cd "$(dirname "$0")/../.." || exit 1
C=$PWD/${CT_BUILD:-build}/ctrain
skip() { echo "$*"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
command -v mpirun >/dev/null || skip "mpirun not installed"
data=${CTRAIN_DATA_DIR:-/usr/share/datasets/fashion-mnist}
[ -r "$data/train-images-idx3-ubyte.gz" ] || [ -r "$data/train-images-idx3-ubyte" ] ||
    skip "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
unset WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE CTRAIN_BACKEND MASTER_PORT
tmp=$(mktemp -d)
. tests/tools/two_hosts.sh
t0=$(date +%s)
# every collective and dtype (build/mpi/mpi_collectives): 2+1 ranks (ordered all-reduce,
# uneven machines), 2+2 interleaved by --map-by node (tree all-reduce, all-gather reorder),
# and 2+2 on the rail all-reduce
# (not in sanitizer builds: as mpi_collectives, left out of CI's ASan run, it takes minutes there)
M=$PWD/${CT_BUILD:-build}/mpi/mpi_collectives
if [ "${CT_BUILD:-build}" = build ]; then
    [ -x "$M" ] || die "$M not built (run make)"
    out=$(mpi_on 10.76.0.1:2,10.76.0.2:1 3 "$M" 2>&1) && [ "$(echo "$out" | grep -c 'collectives ok')" = 3 ] ||
        die "collectives on 2+1 ranks: $out"
    out=$(mpi_2x2 --map-by node -x CTRAIN_DEBUG=INFO -x CTRAIN_DEBUG_SUBSYS=pg "$M" 2>&1) &&
        [ "$(echo "$out" | grep -c 'collectives ok')" = 4 ] || die "collectives on 2+2 interleaved ranks: $out"
    echo "$out" | grep -q "rank 1 is local rank 0 of 2 on node 1 of 2.*tree all-reduce" || die "interleaved ranks not on the tree: $out"
    # CTRAIN_HIER_ALLREDUCE=rail (slice i over local rank i's own MPI group): every collective,
    # and `bench -c` (exact integer data) for sum and avg at odd counts, which 2 ranks do not divide
    out=$(mpi_2x2 -x CTRAIN_HIER_ALLREDUCE=rail -x CTRAIN_DEBUG=INFO -x CTRAIN_DEBUG_SUBSYS=pg "$M" 2>&1) &&
        [ "$(echo "$out" | grep -c 'collectives ok')" = 4 ] || die "collectives on 2+2 ranks, rail all-reduce: $out"
    [ "$(echo "$out" | grep -c "local rank . of 2 on node . of 2.*rail all-reduce")" = 4 ] || die "not on the rails: $out"
    # (machines of unequal size have no rails: the tree)
    out=$(mpi_on 10.76.0.1:2,10.76.0.2:1 3 -x CTRAIN_HIER_ALLREDUCE=rail -x CTRAIN_DEBUG=INFO -x CTRAIN_DEBUG_SUBSYS=pg \
        "$M" 2>&1) && [ "$(echo "$out" | grep -c 'collectives ok')" = 3 ] || die "collectives on 2+1 ranks, rail asked: $out"
    [ "$(echo "$out" | grep -c "on node . of 2.*tree all-reduce")" = 3 ] || die "2+1 ranks with rail asked: not the tree: $out"
    for op in sum avg; do
        out=$(mpi_2x2 -x CTRAIN_HIER_ALLREDUCE=rail "$C" bench allreduce --backend mpi -c -b 4 -e 1M -f 7 -n 2 -w 1 \
            --op $op 2>&1) || die "rail all-reduce $op: $out"
        rows=$(echo "$out" | grep -E '^ *[0-9]+ ')
        [ "$(echo "$rows" | wc -l)" = 7 ] && echo "$rows" | awk '$8 != 0 { bad = 1 } END { exit bad }' ||
            die "rail all-reduce $op: $out"
    done
fi
# 200 steps; 20 in a sanitizer build (CT_BUILD=build-san), whose kernels are ~10x slower
steps=200
[ "${CT_BUILD:-build}" = build ] || steps=20
cnn=(cnn --steps $steps --batch-size 4 --threads 1 --eval-max 64 --log-every 100)
for i in 1 2; do
    tx0=$(tx_bytes)
    # run 1 asks for the sharded step across machines (the default): under mpirun there is no
    # store for its shared memory, so DDP's all-reduce runs, as in run 2, which does not ask
    # (CTRAIN_DDP_SHARD_HIER=0; same bits, checked below)
    shard=(); [ $i = 2 ] && shard=(-x CTRAIN_DDP_SHARD_HIER=0)
    CTRAIN_DEBUG=INFO CTRAIN_DEBUG_SUBSYS=pg mpi_2x2 -x CTRAIN_DEBUG -x CTRAIN_DEBUG_SUBSYS "${shard[@]}" \
        "$C" train "${cnn[@]}" --output-dir "$tmp/h$i" >"$tmp/h$i.log" 2>&1 || die "mpirun run $i failed: $(tail -20 "$tmp/h$i.log")"
    echo "run $i: $(($(tx_bytes) - tx0)) bytes sent from the second namespace"
    echo $(($(tx_bytes) - tx0)) >"$tmp/tx$i"
done
hier_2x2_ok "$tmp/h1.log" mpi
grep -q "^ddp: [0-9]* buckets" "$tmp/h1.log" || die "the sharded step under mpirun: $(grep ^ddp "$tmp/h1.log")"
cmp "$tmp/h1/model.safetensors" "$tmp/h2/model.safetensors" || die "two runs of the same job differ"
same_as_one_host "$tmp/h1/model.safetensors"
# the leaders' all-reduces: 454,922 f32 gradients a step, about one copy per step each way
grad=$((steps * 454922 * 4))
moved=$(cat "$tmp/tx1")
[ "$moved" -gt $((grad * 9 / 10)) ] || die "only $moved bytes crossed the veth (gradients: $grad per direction)"
echo "veth: $moved bytes from the second namespace for $grad bytes of gradients ($(($(date +%s) - t0)) s so far)"
# one namespace's workers killed (mpirun notices), or stopped (only ctrain's timeout notices):
# the job fails within CTRAIN_TIMEOUT + 5 s, naming host and rank
workers() { for p in $(ip netns pids $Bn); do [ "$(cat /proc/$p/comm 2>/dev/null)" = ctrain ] && echo $p; done; }
lose_workers() { # signal, then the pattern the log must show
    CTRAIN_TIMEOUT=5 mpi_2x2 -x CTRAIN_TIMEOUT "$C" train cnn --steps 100000 --batch-size 4 --threads 1 --log-every 5 \
        --output-dir "$tmp/k$1" >"$tmp/k$1.log" 2>&1 &
    local job=$! victims start rc took
    for _ in $(seq 1 300); do [ "$(workers | wc -l)" = 2 ] && break; sleep 0.1; done
    sleep 3 # past the rendezvous
    victims=$(workers)
    [ "$(echo $victims | wc -w)" = 2 ] || die "not 2 ctrain processes in $Bn: $victims"
    start=$(date +%s.%N)
    kill -$1 $victims
    wait $job; rc=$?
    took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    echo "SIG$1 to the workers in $Bn: the job exited with $rc after $took s"
    [ $rc -ne 0 ] || die "the job succeeded after losing two ranks"
    awk -v t="$took" 'BEGIN { exit !(t < 10) }' || die "took $took s to fail (CTRAIN_TIMEOUT=5)"
    grep -Eq "$2" "$tmp/k$1.log" || die "the failure does not name the host and rank: $(tail -20 "$tmp/k$1.log")"
    grep -Eo "$2" "$tmp/k$1.log" | head -1
}
lose_workers KILL "process rank [23] with PID [0-9]+ on node 10\.76\.0\.2"
lose_workers STOP "other machines' leaders: node 1: rank 2 on [^ ]*/netns:[0-9]+"
echo ok
