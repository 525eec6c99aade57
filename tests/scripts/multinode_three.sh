#!/usr/bin/env bash
# `ctrain run --nnodes 3` across three "hosts" (network namespaces on a bridge, each with its
# own /dev/shm), 2 workers per node, the gloo backend between them: the only test where a
# machine sits in the middle of the ordered chain (receives the running sum from machine 0,
# adds its ranks' gradients, passes it on to machine 2, receiving on the rail and sending on a
# third group so that chunks go on as they come). The CNN trained for 20 steps (2 under
# ASan) ends with a one-host 6-rank run's weights, bit for bit, with the sharded optimizer step
# across machines (CTRAIN_DDP_SHARD_HIER=1: the shares' sums go machine to machine in chunks,
# the finished chunks come back on a second group while the next go on; 256 KiB chunks here, 4
# per share in f32, 2 in bf16) and with DDP's ordered all-reduce; with bf16 compression the
# chained step trains and says what crossed in bf16. With the defaults (no
# CTRAIN_HIER_ALLREDUCE) 3 machines take the rail instead of the chain.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=$PWD/${CT_BUILD:-build}/ctrain
skip() { echo "$*"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
. tests/tools/fashion_mnist.sh
nm ${CT_BUILD:-build}/libctrain.a 2>/dev/null | grep -q "T ct_gloo_create" || skip "built without Gloo (apt-get install libgloo-dev)"
tmp=$(mktemp -d)
net=10.79.0 p=ct3h$$
cleanup() {
    for k in 0 1 2; do ip netns pids $p$k 2>/dev/null | xargs -r kill -9 2>/dev/null; done
    for k in 0 1 2; do ip netns del $p$k 2>/dev/null; done
    ip netns del ${p}sw 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add ${p}sw 2>"$tmp/err" || skip "cannot create network namespaces here ($(head -1 "$tmp/err"))"
ip -n ${p}sw link add br0 type bridge && ip -n ${p}sw link set br0 up || die "bridge"
for k in 0 1 2; do
    ip netns add $p$k || die "namespace $k"
    ip link add ${p}e$k type veth peer name ${p}s$k || die "veth $k"
    ip link set ${p}e$k netns $p$k && ip link set ${p}s$k netns ${p}sw || die "moving veth $k"
    ip -n $p$k addr add $net.$((k + 1))/24 dev ${p}e$k && ip -n $p$k link set ${p}e$k up && ip -n $p$k link set lo up ||
        die "host $k's link"
    ip -n ${p}sw link set ${p}s$k master br0 && ip -n ${p}sw link set ${p}s$k up || die "switch port $k"
done
printf '0123456789abcdef-three\n' >"$tmp/s"; chmod 600 "$tmp/s"
steps=20; [ "${CT_BUILD:-build}" = build-san ] && steps=2
cnn=(train cnn --steps $steps --batch-size 8 --threads 1 --eval-max 16 --log-every 10)
port=29590
# nodes OUT [ctrain train options]: the 3 x 2 job, one launcher per namespace
nodes() {
    local out=$1 k pids=() rc=0; shift
    port=$((port + 1))
    for k in 0 1 2; do
        ip netns exec $p$k sh -c 'mount -t tmpfs ctshm /dev/shm && exec "$@"' sh timeout 120 $B run --nnodes 3 \
            --nproc-per-node 2 --node-rank $k --master-addr $net.1 --master-port $port --rdzv-token-file "$tmp/s" \
            $B "${cnn[@]}" --output-dir "$out" "$@" >"$out.$k" 2>&1 &
        pids+=($!)
    done
    for k in "${pids[@]}"; do wait $k || rc=1; done
    [ $rc = 0 ] || die "3 x 2 job into $out: $(tail -5 "$out.0" "$out.1" "$out.2")"
    grep -q "6 ranks × batch 8 .* $steps steps" "$out.0" || die "not a 6-rank job: $(head -3 "$out.0")"
}
$B run --nproc-per-node 6 --standalone $B "${cnn[@]}" --output-dir "$tmp/ref" >"$tmp/ref.log" 2>&1 ||
    die "one-host run: $(tail -5 "$tmp/ref.log")"

export CTRAIN_DEBUG=INFO CTRAIN_DEBUG_SUBSYS=zero
# the ordered sum asked for: on 3 machines the default is the rail all-reduce
export CTRAIN_HIER_ALLREDUCE=ordered
CTRAIN_DDP_SHARD_HIER=1 CTRAIN_HIER_CHAIN_CHUNK=256k nodes "$tmp/chain"
CTRAIN_DDP_SHARD_HIER=0 nodes "$tmp/ar"
CTRAIN_DDP_SHARD_HIER=1 CTRAIN_HIER_CHAIN_CHUNK=256k nodes "$tmp/bf" --grad-compression bf16
unset CTRAIN_HIER_ALLREDUCE
nodes "$tmp/auto" # the defaults: the sharded step, its shares' sums all-reduced on the rails
# the rails in 16 KiB chunks, each all-reduced as backward finishes it, and the share whole
# after backward (CTRAIN_HIER_CHAIN_EARLY=0)
CTRAIN_HIER_CHAIN_CHUNK=16k nodes "$tmp/rearly"
CTRAIN_HIER_CHAIN_EARLY=0 nodes "$tmp/rlate"
unset CTRAIN_DEBUG CTRAIN_DEBUG_SUBSYS
[ "$(cat "$tmp/chain".[012] | grep -c "shared by the 2 ranks of this machine ([012] of 3).*passed on in rank order across machines in f32")" = 6 ] ||
    die "not the chained sharded step: $(grep -h zero "$tmp/chain".[012])"
grep -q "^ddp: [0-9]* buckets" "$tmp/ar.0" || die "not DDP's all-reduce: $(grep ^ddp "$tmp/ar.0")"
[ "$(cat "$tmp/bf".[012] | grep -c "passed on in rank order across machines in bf16")" = 6 ] ||
    die "bf16: not the chained sharded step: $(grep -h zero "$tmp/bf".[012])"
[ "$(cat "$tmp/auto".[012] | grep -c "shared by the 2 ranks of this machine.*all-reduced across machines in f32")" = 6 ] ||
    die "3 machines, the defaults: not the sharded step on the rails: $(grep -h zero "$tmp/auto".[012])"
early=$(grep -h "chunks crossed the network during backward" "$tmp/rearly".[012] | awk '{ e += $(NF-8); a += $(NF-6) } END { print e "/" a }')
[ "${early%/*}" -gt 0 ] 2>/dev/null || die "rails: no chunk all-reduced during backward ($early)"
! grep -q "crossed the network during backward" "$tmp/rlate".[012] || die "rails, CTRAIN_HIER_CHAIN_EARLY=0: chunks during backward"
# chunked, each all-reduce splits its own buffer over the ring: the sums may differ in the last bit
rails=$(python3 tests/tools/weights_close.py "$tmp/rlate/model.safetensors" "$tmp/rearly/model.safetensors" 1e-5) ||
    die "rails: chunks during backward against the share after it: $rails"
cmp -s "$tmp/ref/model.safetensors" "$tmp/chain/model.safetensors" || die "the chained sharded step: not the one-host bits"
cmp -s "$tmp/ref/model.safetensors" "$tmp/ar/model.safetensors" || die "the ordered all-reduce: not the one-host bits"
grep -Eq "^step +$steps/$steps .*loss [0-9]" "$tmp/bf.0" || die "bf16: no last step: $(tail -3 "$tmp/bf.0")"
echo "3 hosts x 2 ranks: the chained sharded step and the ordered all-reduce give the one-host bits; bf16 trains;" \
     "rails: $early chunks all-reduced during backward, weights as after backward ($rails)"
