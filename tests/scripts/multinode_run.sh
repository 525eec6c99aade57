#!/usr/bin/env bash
# `ctrain run --nnodes 2` across two "hosts": network namespaces joined by a veth pair
# (10.78.0.1 and 10.78.0.2), one launcher in each, 2 workers per node, no mpirun, so the gloo
# backend. Checks: the CNN trained for 200 steps (3 under ASan) ends with the same weights
# (bit for bit) as a one-host 4-rank run on the shm backend, with DDP's all-reduce and with
# the sharded optimizer step across machines (the default; CTRAIN_DDP_SHARD_HIER=0: the all-reduce), the gradient traffic really on the veth; on the rails too, and
# with bf16 compression; node 0 makes the store secret up (a 0600 file) and
# node 1 joins with that file, a node with another secret is refused; the rail all-reduce's sums are exact; when node 1's workers are killed, node 0
# fails within CTRAIN_TIMEOUT + 5 s naming the lost rank and its host.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=$PWD/${CT_BUILD:-build}/ctrain
skip() { echo "$*"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
. tests/tools/fashion_mnist.sh
nm ${CT_BUILD:-build}/libctrain.a 2>/dev/null | grep -q "T ct_gloo_create" || skip "built without Gloo (apt-get install libgloo-dev)"
command -v python3 >/dev/null || skip "no python3 to compare the weights with"
tmp=$(mktemp -d)
TWO_HOSTS_NET=10.78.0 # beside the other two-host tests
. tests/tools/two_hosts.sh # namespaces $A and $Bn joined by a veth; tx_bytes

# 200 steps; 3 in the sanitizer build (-O1 and ASan: a CNN step takes seconds there)
steps=200 ev=256; [ "${CT_BUILD:-build}" = build-san ] && steps=3 ev=16
cnn=(train cnn --steps $steps --batch-size 8 --threads 1 --eval-max $ev --log-every 10)
# node K of 2 in its namespace, in the background; the rest of the arguments go to ctrain run
node() {
    local k=$1 log=$2; shift 2
    ip netns exec "$([ "$k" = 0 ] && echo $A || echo $Bn)" timeout 80 $B run --nnodes 2 --nproc-per-node 2 \
        --node-rank "$k" --master-addr 10.78.0.1 --master-port 29478 "$@" >"$log" 2>&1 &
}
# the file holding node 0's secret, named on its stderr
secret() {
    for _ in $(seq 200); do
        s=$(sed -n 's/.*store secret is in \([^ ]*\) (mode 0600).*/\1/p' "$1" 2>/dev/null)
        [ -n "$s" ] && { echo "$s"; return 0; }
        sleep 0.05
    done
    return 1
}

printf '0123456789abcdef-right\n' >"$tmp/s"; printf '0123456789abcdef-wrong\n' >"$tmp/w"; chmod 600 "$tmp/s" "$tmp/w"
$B run --nproc-per-node 4 --standalone $B "${cnn[@]}" --output-dir "$tmp/ref" >"$tmp/ref.log" 2>&1 ||
    die "one-host run: $(tail -5 "$tmp/ref.log")"
for rep in 1 2; do
    tx0=$(tx_bytes)
    # run 1: the sharded optimizer step across machines (the default: each machine's ranks
    # share a segment, the shares' sums go machine to machine in rank order); run 2: DDP's
    # ordered all-reduce (CTRAIN_DDP_SHARD_HIER=0)
    [ $rep = 2 ] && export CTRAIN_DDP_SHARD_HIER=0
    node 0 "$tmp/n0.$rep" $B "${cnn[@]}" --output-dir "$tmp/mn$rep"; p0=$!
    tok=$(secret "$tmp/n0.$rep") || die "node 0 printed no store secret file: $(cat "$tmp/n0.$rep")"
    node 1 "$tmp/n1.$rep" --rdzv-token-file "$tok" $B "${cnn[@]}" --output-dir "$tmp/mn$rep"; p1=$!
    unset CTRAIN_DDP_SHARD_HIER
    wait $p1 || die "node 1 (run $rep): $(tail -8 "$tmp/n1.$rep")"
    wait $p0 || die "node 0 (run $rep): $(tail -8 "$tmp/n0.$rep")"
    moved=$(( $(tx_bytes) - tx0 ))
    # steps x 455k f32 gradients: node 1's ranks send over 0.5 MB a step when the traffic is real
    [ $moved -gt $((steps * 500000)) ] || die "only $moved bytes left node 1 over the veth in $steps steps"
    grep -q "4 ranks × batch 8 .* $steps steps" "$tmp/n0.$rep" || die "not a 4-rank job: $(head -3 "$tmp/n0.$rep")"
done
grep -q "^ddp: sharded optimizer step" "$tmp/n0.1" || die "run 1 did not take the sharded step: $(grep ^ddp "$tmp/n0.1")"
grep -q "^ddp: [0-9]* buckets" "$tmp/n0.2" || die "run 2 did not all-reduce buckets: $(grep ^ddp "$tmp/n0.2")"
cmp -s "$tmp/mn1/model.safetensors" "$tmp/mn2/model.safetensors" || die "sharded step and all-reduce across the namespaces differ"
# the ordered all-reduce (the default) sums in world rank order, as the one-host run does: the
# same bits
rel=$(python3 tests/tools/weights_close.py "$tmp/ref/model.safetensors" "$tmp/mn1/model.safetensors" 1e-5) ||
    die "weights differ from the one-host run: $rel"
cmp -s "$tmp/ref/model.safetensors" "$tmp/mn1/model.safetensors" || die "not the one-host run's bits (within $rel)"

# CTRAIN_HIER_ALLREDUCE=rail (slice i over local rank i's own Gloo group): `bench -c` (exact
# integer data) for sum and avg at odd counts, which the 2 local ranks do not divide
for op in sum avg; do
    export CTRAIN_HIER_ALLREDUCE=rail CTRAIN_DEBUG=INFO CTRAIN_DEBUG_SUBSYS=pg
    ar=(bench allreduce --backend hier -c -b 4 -e 1M -f 7 -n 2 -w 1 --op $op)
    node 0 "$tmp/r0$op" --rdzv-token-file "$tmp/s" $B "${ar[@]}"; p0=$!
    node 1 "$tmp/r1$op" --rdzv-token-file "$tmp/s" $B "${ar[@]}"; p1=$!
    unset CTRAIN_HIER_ALLREDUCE CTRAIN_DEBUG CTRAIN_DEBUG_SUBSYS
    wait $p1 || die "rail all-reduce $op, node 1: $(tail -8 "$tmp/r1$op")"
    wait $p0 || die "rail all-reduce $op, node 0: $(tail -8 "$tmp/r0$op")"
    rows=$(grep -E '^ *[0-9]+ ' "$tmp/r0$op")
    [ "$(echo "$rows" | wc -l)" = 7 ] && echo "$rows" | awk '$8 != 0 { bad = 1 } END { exit bad }' ||
        die "rail all-reduce $op: $(cat "$tmp/r0$op")"
    [ "$(cat "$tmp/r0$op" "$tmp/r1$op" | grep -c "local rank . of 2 on node . of 2.*gloo between 2 leaders, rail all-reduce")" = 4 ] ||
        die "not on the rails: $(grep hier "$tmp/r0$op" "$tmp/r1$op")"
done

# the sharded step on the rails (an all-reduce of each machine's sum of a share) has the rail
# all-reduce's bits; with bf16 compression only the sums crossing the network are bf16
zs=20; [ "${CT_BUILD:-build}" = build-san ] && zs=3
short=(train cnn --steps $zs --batch-size 8 --threads 1 --eval-max 16 --log-every 10)
for v in "rail 1 f32" "rail 0 f32" "rail 1 bf16" "ordered 1 bf16"; do
    set -- $v
    export CTRAIN_HIER_ALLREDUCE=$1 CTRAIN_DDP_SHARD_HIER=$2 CTRAIN_DEBUG=INFO CTRAIN_DEBUG_SUBSYS=zero
    node 0 "$tmp/z0$1$2$3" --rdzv-token-file "$tmp/s" $B "${short[@]}" --grad-compression ${3/f32/none} --output-dir "$tmp/z$1$2$3"; p0=$!
    node 1 "$tmp/z1$1$2$3" --rdzv-token-file "$tmp/s" $B "${short[@]}" --grad-compression ${3/f32/none} --output-dir "$tmp/z$1$2$3"; p1=$!
    unset CTRAIN_HIER_ALLREDUCE CTRAIN_DDP_SHARD_HIER CTRAIN_DEBUG CTRAIN_DEBUG_SUBSYS
    wait $p1 || die "$v, node 1: $(tail -8 "$tmp/z1$1$2$3")"
    wait $p0 || die "$v, node 0: $(tail -8 "$tmp/z0$1$2$3")"
    want="all-reduced across machines in $3"; [ $1 = ordered ] && want="passed on in rank order across machines in $3"
    [ $2 = 0 ] || [ "$(cat "$tmp/z0$1$2$3" "$tmp/z1$1$2$3" | grep -c "shared by the 2 ranks of this machine.*$want")" = 4 ] ||
        die "$v: not the sharded step across machines: $(grep -h zero "$tmp/z0$1$2$3" "$tmp/z1$1$2$3")"
    # ordered: the chunks of the top share went on while backward ran (ct_ddp_set_progress)
    [ $1 = ordered ] && { grep -h "chunks crossed the network during backward" "$tmp/z0$1$2$3" "$tmp/z1$1$2$3" |
        awk '$(NF-8) > 0 { n++ } END { exit !(n >= 2) }' ||
        die "$v: no chunk went on during backward: $(grep -h "went on" "$tmp/z0$1$2$3" "$tmp/z1$1$2$3")"; }
done
cmp -s "$tmp/zrail1f32/model.safetensors" "$tmp/zrail0f32/model.safetensors" ||
    die "rail: the sharded step's weights differ from the rail all-reduce's"

# the GPT (its embedding tied to the LM head: that gradient is final only at backward's end)
# with 4 KiB chunks, so that many go on during backward: the one-host bits, and the same with
# the chunks held until backward ends (CTRAIN_HIER_CHAIN_EARLY=0), also when only node 0 says
# so (m: every rank takes the same decision)
gs=8; [ "${CT_BUILD:-build}" = build-san ] && gs=2
gpt=(train gpt --n-layer 2 --n-embd 64 --n-head 4 --block-size 32 --vocab-size 256 --batch-size 4 --steps $gs --threads 1
     --eval-max 8 --log-every 4 --text /usr/share/common-licenses/GPL-3)
$B run --nproc-per-node 4 --standalone $B "${gpt[@]}" --output-dir "$tmp/gref" >"$tmp/gref.log" 2>&1 ||
    die "one-host GPT run: $(tail -5 "$tmp/gref.log")"
for e in 1 0 m; do
    export CTRAIN_HIER_CHAIN_CHUNK=4k CTRAIN_HIER_CHAIN_EARLY=${e/m/0} CTRAIN_DEBUG=INFO CTRAIN_DEBUG_SUBSYS=zero
    node 0 "$tmp/g0$e" --rdzv-token-file "$tmp/s" $B "${gpt[@]}" --output-dir "$tmp/g$e"; p0=$!
    export CTRAIN_HIER_CHAIN_EARLY=${e/m/1}
    node 1 "$tmp/g1$e" --rdzv-token-file "$tmp/s" $B "${gpt[@]}" --output-dir "$tmp/g$e"; p1=$!
    unset CTRAIN_HIER_CHAIN_CHUNK CTRAIN_HIER_CHAIN_EARLY CTRAIN_DEBUG CTRAIN_DEBUG_SUBSYS
    wait $p1 || die "GPT, early $e, node 1: $(tail -8 "$tmp/g1$e")"
    wait $p0 || die "GPT, early $e, node 0: $(tail -8 "$tmp/g0$e")"
    cmp -s "$tmp/gref/model.safetensors" "$tmp/g$e/model.safetensors" ||
        die "GPT, early $e: not the one-host run's bits ($(python3 tests/tools/weights_close.py "$tmp/gref/model.safetensors" \
            "$tmp/g$e/model.safetensors" 1e-5))"
done
early=$(grep -h "chunks crossed the network during backward" "$tmp/g01" "$tmp/g11" | awk '{ e += $(NF-8); a += $(NF-6) } END { print e "/" a }')
[ "${early%/*}" -gt 0 ] 2>/dev/null || die "GPT: no chunk went on during backward ($early)"
! grep -q "crossed the network during backward" "$tmp/g00" "$tmp/g10" || die "GPT, CTRAIN_HIER_CHAIN_EARLY=0: chunks went on during backward"
! grep -q "crossed the network during backward" "$tmp/g0m" "$tmp/g1m" ||
    die "GPT, CTRAIN_HIER_CHAIN_EARLY=0 on node 0 only: chunks went on during backward on node 1"

# node 1's workers die: node 0 stops within CTRAIN_TIMEOUT + 5 s and says which rank on which host
export CTRAIN_TIMEOUT=5
long=(train cnn --steps 100000 --batch-size 8 --threads 1 --eval-max 16 --log-every 1)
node 0 "$tmp/k0" --rdzv-token-file "$tmp/s" $B "${long[@]}" --output-dir "$tmp/k"; p0=$!
node 1 "$tmp/k1" --rdzv-token-file "$tmp/s" $B "${long[@]}" --output-dir "$tmp/k"; p1=$!
for _ in $(seq 600); do grep -q "^step " "$tmp/k0" 2>/dev/null && break; sleep 0.1; done
grep -q "^step " "$tmp/k0" 2>/dev/null ||
    die "the job did not start: $(ls -l "$tmp"; tail -5 "$tmp/k0" "$tmp/k1"; ps -o pid,args -p "$(ip netns pids $A | tr '\n' ,)0")"
for p in $(ip netns pids $Bn); do # the workers, not their launcher: argv[1] is "train"
    [ "$(tr '\0' '\n' < /proc/$p/cmdline 2>/dev/null | sed -n 2p)" = train ] && kill -9 "$p"
done
t0=$(date +%s.%N)
wait $p0 && die "node 0 succeeded without node 1"
dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
awk -v d="$dt" -v t=$CTRAIN_TIMEOUT 'BEGIN { exit !(d <= t + 5) }' || die "node 0 took $dt s to fail"
# (where Gloo names only the peer's host: "rank 2 or 3")
lost=$(grep -Eo "lost rank [23]( or [23])? of 4 on [^(]*10\.78\.0\.2" "$tmp/k0" | head -1)
[ -n "$lost" ] || die "no rank and host in node 0's report: $(tail -12 "$tmp/k0")"
wait $p1

# a node with another secret is turned away at the store
node 0 "$tmp/w0" --rdzv-token-file "$tmp/s" $B "${cnn[@]}" --output-dir "$tmp/w"; p0=$!
node 1 "$tmp/w1" --rdzv-token-file "$tmp/w" $B "${cnn[@]}" --output-dir "$tmp/w"; p1=$!
wait $p1 && die "node 1 with the wrong secret ran"
grep -qi "token" "$tmp/w1" || die "wrong secret: $(tail -5 "$tmp/w1")"
kill $p0 2>/dev/null; wait $p0 2>/dev/null

echo "2 nodes x 2 ranks, $steps steps: weights as one host's ($rel), repeatable; GPT: the one-host bits," \
     "$early chunks on during backward;" \
     "$moved bytes over the veth; wrong secret refused ($(grep -m1 -io "[^:]*token[^:]*" "$tmp/w1"));" \
     "node 0 failed $dt s after node 1's workers were killed: \"$lost\""
