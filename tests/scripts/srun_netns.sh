#!/usr/bin/env bash
# Slurm's srun with PMIx across two "hosts" (network namespaces joined by a veth pair,
# 10.81.0.0/24), a real slurmctld and one slurmd per namespace (tests/tools/slurm_cluster.sh),
# 2 tasks on each node, no ctrain variables: `ctrain train cnn` takes MPI's world from PMIx
# and the hier backend (shm inside a node, MPI between the two leaders). Checks: final weights
# within 1e-5 relative of a one-host 4-rank `ctrain run`, the same bits on a second run, and
# that killing one node's workers fails the job within CTRAIN_TIMEOUT + 5 s naming host and rank.
set -u
cd "$(dirname "$0")/../.." || exit 1
C=$PWD/${CT_BUILD:-build}/ctrain
skip() { echo "$*"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
. tests/tools/fashion_mnist.sh
nm ${CT_BUILD:-build}/libctrain.a 2>/dev/null | grep -q "T ct_mpi_create" || die "built without MPI (scripts/setup.sh installs libopenmpi-dev)"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
unset WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE CTRAIN_BACKEND MASTER_ADDR MASTER_PORT CTRAIN_STORE_TOKEN
tmp=$(mktemp -d)
TWO_HOSTS_NET=10.81.0 # beside the other two-host tests
. tests/tools/two_hosts.sh
. tests/tools/slurm_cluster.sh
t0=$(date +%s.%N)
slurm_up
echo "Slurm up (2 nodes) in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"

# 200 steps; 20 in a sanitizer build (CT_BUILD=build-san), whose kernels are ~10x slower
steps=200
[ "${CT_BUILD:-build}" = build ] || steps=20
cnn=(cnn --steps $steps --batch-size 4 --threads 1 --eval-max 64 --log-every 100)
for i in 1 2; do
    CTRAIN_DEBUG=INFO CTRAIN_DEBUG_SUBSYS=pg timeout 120 ip netns exec $A srun --mpi=pmix -N 2 --ntasks-per-node 2 \
        "$C" train "${cnn[@]}" --output-dir "$tmp/s$i" >"$tmp/s$i.log" 2>&1 || die "srun run $i failed: $(tail -20 "$tmp/s$i.log")"
done
hier_2x2_ok "$tmp/s1.log" mpi
cmp "$tmp/s1/model.safetensors" "$tmp/s2/model.safetensors" || die "two runs of the same job differ"
same_as_one_host "$tmp/s1/model.safetensors"
# MASTER_ADDR/MASTER_PORT/CTRAIN_STORE_TOKEN exported: ctrain's store instead of MPI (hier with
# Gloo between the leaders, where built with Gloo), here without --ntasks-per-node (the layout
# comes from SLURM_STEP_TASKS_PER_NODE)
if nm ${CT_BUILD:-build}/libctrain.a 2>/dev/null | grep -q "T ct_gloo_create"; then
    MASTER_ADDR=$net.1 MASTER_PORT=29581 CTRAIN_STORE_TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n') \
        CTRAIN_DEBUG=INFO CTRAIN_DEBUG_SUBSYS=pg timeout 120 ip netns exec $A srun -N 2 -n 4 \
        "$C" train "${cnn[@]}" --output-dir "$tmp/st" >"$tmp/st.log" 2>&1 || die "srun with a store failed: $(tail -20 "$tmp/st.log")"
    hier_2x2_ok "$tmp/st.log" gloo
    same_as_one_host "$tmp/st/model.safetensors"
fi
# without PMIx (--mpi=none) and without MASTER_ADDR there is no place to meet: refused at once
out=$(timeout 60 ip netns exec $A srun --mpi=none -N 2 --ntasks-per-node 2 "$C" train cnn --steps 5 --output-dir "$tmp/np" 2>&1) &&
    die "srun --mpi=none across 2 machines without MASTER_ADDR succeeded: $out"
echo "$out" | grep -q "srun started 2 machines without PMIx and MASTER_ADDR is unset" || die "srun --mpi=none: $out"
echo "srun runs (PMIx twice, store, no PMIx) and the reference in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"

# the second node's workers killed: the job fails within CTRAIN_TIMEOUT + 5 s, naming host and rank
workers() { for p in $(ip netns pids $Bn); do [ "$(cat /proc/$p/comm 2>/dev/null)" = ctrain ] && echo $p; done; }
CTRAIN_TIMEOUT=5 timeout 120 ip netns exec $A srun --mpi=pmix -N 2 --ntasks-per-node 2 "$C" train cnn --steps 100000 \
    --batch-size 4 --threads 1 --log-every 5 --output-dir "$tmp/k" >"$tmp/k.log" 2>&1 &
job=$!
for _ in $(seq 300); do [ "$(workers | wc -l)" = 2 ] && break; sleep 0.1; done
sleep 3 # past the rendezvous
victims=$(workers)
[ "$(echo $victims | wc -w)" = 2 ] || die "not 2 ctrain processes in $Bn: $victims"
start=$(date +%s.%N)
kill -KILL $victims
wait $job; rc=$?
took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "SIGKILL to the workers on node n2: the job exited with $rc after $took s"
[ $rc -ne 0 ] || die "the job succeeded after losing two ranks"
awk -v t="$took" 'BEGIN { exit !(t < 10) }' || die "took $took s to fail (CTRAIN_TIMEOUT=5): $(tail -20 "$tmp/k.log")"
grep -Eq "n2: tasks? [23]" "$tmp/k.log" || die "the failure does not name the host and rank: $(tail -20 "$tmp/k.log")"
grep -Eo "n2: tasks? [-0-9]+: [A-Za-z ]+" "$tmp/k.log" | head -1
echo "ok ($(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }') s)"
