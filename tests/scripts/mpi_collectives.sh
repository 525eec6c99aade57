#!/usr/bin/env bash
# The mpi backend on one machine under mpirun: 2 and 3 ranks run build/mpi/mpi_collectives
# (every collective, async work, subgroups; every dtype; exact integer patterns), then
# all-reduce through `ctrain worker` and `ctrain bench`. Rank variables come from Open MPI's
# environment.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=$PWD/${CT_BUILD:-build}/ctrain
skip() { echo "$*"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
command -v mpirun >/dev/null || skip "mpirun not installed"
nm -C ${CT_BUILD:-build}/libctrain.a 2>/dev/null | grep -q "ct_mpi_create" || skip "built without MPI (apt-get install libopenmpi-dev)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Under ASan (make test-asan): Open MPI is built without frame pointers, so leak stacks taken
# the fast way stop inside it and tests/asan.supp cannot recognise its own leaks.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
mpi() { timeout 120 mpirun --oversubscribe --mca btl self,vader,tcp "$@"; }
[ -x ${CT_BUILD:-build}/mpi/mpi_collectives ] || die "${CT_BUILD:-build}/mpi/mpi_collectives not built (run make)"
for np in 2 3; do
    out=$(mpi -np $np ${CT_BUILD:-build}/mpi/mpi_collectives 2>&1) || die "mpi_collectives np=$np: $out"
    [ "$(echo "$out" | grep -c 'mpi collectives ok')" = $np ] || die "mpi_collectives np=$np: $out"
done
for np in 2 3; do
    out=$(mpi -np $np $B worker allreduce 2>&1) || die "np=$np: $out"
    [ "$(echo "$out" | grep -c 'all-reduce ok')" = $np ] || die "np=$np: $out"
done
for dt in f32 f16 bf16 f64 i32 i64; do
    for op in sum avg max prod; do
        out=$(mpi -np 2 $B bench allreduce --backend mpi -c -b 2 -e 1M -f 64 --dtype $dt --op $op -n 2 -w 1 2>&1) \
            || die "$dt $op: $out"
        echo "$out" | grep -v '^#' | awk '$8 != 0 { bad = 1 } END { exit bad }' || die "wrong ($dt $op): $out"
    done
done
echo ok
