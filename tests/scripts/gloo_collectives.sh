#!/usr/bin/env bash
# The gloo backend on one machine under `ctrain run` (CTRAIN_BACKEND=gloo): 2 and 3 ranks run
# build/mpi/mpi_collectives (every collective, async work, subgroups; every dtype; exact
# integer patterns), `ctrain bench allreduce --backend gloo -c` checks its sums, and
# the CNN trained on gloo ends with the same bits as on shm (the same summation order).
# A bad CTRAIN_GLOO_IFADDR is one clear error. Gloo's event loop runs at CTRAIN_GLOO_LOOP_NICE.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=$PWD/${CT_BUILD:-build}/ctrain
skip() { echo "$*"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
nm ${CT_BUILD:-build}/libctrain.a 2>/dev/null | grep -q "T ct_gloo_create" || skip "built without Gloo (apt-get install libgloo-dev)"
[ -x ${CT_BUILD:-build}/mpi/mpi_collectives ] || skip "${CT_BUILD:-build}/mpi/mpi_collectives not built (needs libopenmpi-dev)"
export CTRAIN_BACKEND=gloo CTRAIN_TIMEOUT=60
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for np in 2 3; do
    out=$(timeout 120 $B run --standalone --nproc-per-node $np ${CT_BUILD:-build}/mpi/mpi_collectives 2>&1) ||
        die "collectives np=$np: $out"
    [ "$(echo "$out" | grep -c 'gloo collectives ok')" = $np ] || die "collectives np=$np: $out"
done
# (mpi_collectives covers every dtype and op; here the command's own check, sizes not divisible by 3)
for dtop in "f32 sum" "bf16 avg" "i64 min"; do
    set -- $dtop
    out=$(timeout 60 $B bench allreduce --backend gloo --np 3 -c -b 2 -e 200K -f 23 --dtype $1 --op $2 -n 2 -w 1 2>&1) ||
        die "bench $dtop: $out"
    rows=$(echo "$out" | grep -E '^ *[0-9]+ ')
    [ "$(echo "$rows" | wc -l)" -ge 3 ] && echo "$rows" | awk '$8 != 0 { bad = 1 } END { exit bad }' || die "bench $dtop: $out"
done
data=${CTRAIN_DATA_DIR:-/usr/share/datasets/fashion-mnist}
if [ -r "$data/train-images-idx3-ubyte.gz" ] || [ -r "$data/train-images-idx3-ubyte" ]; then
    steps=30; [ "${CT_BUILD:-build}" = build-san ] && steps=3 # a CNN step takes seconds under ASan
    cnn=(train cnn --steps $steps --batch-size 8 --threads 1 --eval-max 16 --log-every 10)
    for be in shm gloo; do
        CTRAIN_BACKEND=$be $B run --standalone --nproc-per-node 3 $B "${cnn[@]}" --output-dir "$tmp/$be" >"$tmp/$be.log" 2>&1 ||
            die "cnn on $be: $(tail -5 "$tmp/$be.log")"
    done
    cmp -s "$tmp/shm/model.safetensors" "$tmp/gloo/model.safetensors" || die "the CNN trained on gloo differs from shm"
    cnn_note="; CNN on gloo bit-identical to shm"
else
    cnn_note="; (Fashion-MNIST not installed: no CNN comparison)"
fi
out=$(CTRAIN_GLOO_IFADDR=10.255.255.254 timeout 60 $B bench allreduce --backend gloo -n 1 -b 8 -e 8 2>&1) &&
    die "an address not on this host was accepted: $out"
echo "$out" | grep -q "gloo backend: rank [01] of 2 cannot connect from 10.255.255.254" || die "bad CTRAIN_GLOO_IFADDR: $out"
# Gloo's event loop runs at CTRAIN_GLOO_LOOP_NICE (default 19: where threads outnumber cores its
# spin on a busy connection must give way), the ranks' own threads at the process's nice.
# nice_counts NICE: "threads-at-19 threads", the most of each seen over 10 s, among the ranks
# of a running 2-rank gloo bench (its launcher left out)
pat="bench allgather --backend gloo --np 2 -b 4K -e 4K -n 1000000"
nice_counts() {
    CTRAIN_GLOO_LOOP_NICE=$1 timeout 60 $B $pat -w 1 >"$tmp/nice.log" 2>&1 &
    local bp=$! k=0 n=0 i a t
    for i in $(seq 100); do
        read -r a t < <(for p in $(pgrep -f "$pat"); do [ $p = $bp ] || cat /proc/$p/task/*/stat 2>/dev/null; done |
            awk '{ n++; if ($19 == 19) k++ } END { print k + 0, n + 0 }')
        [ "$a" -gt $k ] && k=$a
        [ "$t" -gt $n ] && n=$t
        [ $k -ge 2 ] && break
        sleep 0.1
    done
    pkill -f "$pat"; wait $bp 2>/dev/null
    echo "$k $n"
}
got=$(nice_counts 19)
[ "${got% *}" -ge 2 ] || die "no Gloo event loop at nice 19 (threads at 19, threads: $got): $(tail -3 "$tmp/nice.log")"
[ "${got% *}" -lt "${got#* }" ] || die "every thread at nice 19, the ranks' own too: $got"
got=$(nice_counts 0)
[ "${got% *}" = 0 ] && [ "${got#* }" -ge 4 ] || die "CTRAIN_GLOO_LOOP_NICE=0 (threads at 19, threads: $got)"
out=$(CTRAIN_GLOO_LOOP_NICE=20 timeout 60 $B bench allreduce --backend gloo -n 1 -b 8 -e 8 2>&1) &&
    die "CTRAIN_GLOO_LOOP_NICE=20 was accepted: $out"
echo "$out" | grep -q "CTRAIN_GLOO_LOOP_NICE" || die "CTRAIN_GLOO_LOOP_NICE=20 not named: $out"
echo "gloo: collectives on 2 and 3 ranks, bench checks$cnn_note; bad address refused; event loop at nice 19 (0 when asked), a nice of 20 refused"
