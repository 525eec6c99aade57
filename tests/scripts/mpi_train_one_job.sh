#!/usr/bin/env bash
# Regression: `mpirun -np 2 ctrain train` without WORLD_SIZE ran two independent one-rank
# jobs writing one output directory. Now it is one 2-rank job (ct_dist_detect reads
# OMPI_COMM_WORLD_*) with the same weights as `ctrain run --nproc-per-node 2` (within 1e-5
# relative), and a world of one under a 2-process mpirun is refused with a clear message.
set -u
cd "$(dirname "$0")/../.." || exit 1
unset WORLD_SIZE RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK PMI_SIZE PMI_RANK SLURM_PROCID SLURM_NTASKS PMIX_RANK
C=$PWD/${CT_BUILD:-build}/ctrain
skip() { echo "$*"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
# the same rule without mpirun: other launchers' variables, bad values (refused before any work)
refused() { # expected message, then the environment
    local want=$1; shift
    out=$(env "$@" "$C" train mlp --steps 1 --output-dir "$d/x" 2>&1) && die "ran with $*: $out"
    echo "$out" | grep -q "$want" || die "with $*: unclear message: $out"
    [ ! -e "$d/x/model.safetensors" ] || die "a refused job wrote weights"
}
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
refused "WORLD_SIZE=1 but SLURM_NTASKS=2" SLURM_PROCID=1 SLURM_NTASKS=2 WORLD_SIZE=1
refused "WORLD_SIZE=1 but PMI_SIZE=4" PMI_RANK=2 PMI_SIZE=4 WORLD_SIZE=1
refused "OMPI_COMM_WORLD_RANK=5 is not below OMPI_COMM_WORLD_SIZE=2" OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=5
refused "PMIX_RANK=1: a PMIx launcher" PMIX_RANK=1
command -v mpirun >/dev/null || skip "mpirun not installed"
data=${CTRAIN_DATA_DIR:-/usr/share/datasets/fashion-mnist}
[ -r "$data/train-images-idx3-ubyte.gz" ] || [ -r "$data/train-images-idx3-ubyte" ] ||
    skip "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_base_warn_component_unused=0
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
unset WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE CTRAIN_BACKEND
steps=20
[ "${CT_BUILD:-build}" = build ] || steps=4 # sanitizer builds: ~10x slower kernels
cnn=(cnn --steps $steps --batch-size 16 --threads 1 --eval-max 256 --log-every 10)
timeout 120 mpirun -np 2 --oversubscribe "$C" train "${cnn[@]}" --output-dir "$d/mpi" >"$d/mpi.log" 2>&1 ||
    die "mpirun -np 2 ctrain train failed: $(cat "$d/mpi.log")"
grep -q "| 2 ranks × batch 16 = global batch 32 |" "$d/mpi.log" || die "not one 2-rank job: $(cat "$d/mpi.log")"
[ "$(grep -c '^done:' "$d/mpi.log")" = 1 ] || die "more than one job reported: $(cat "$d/mpi.log")"
timeout 120 "$C" run --nproc-per-node 2 --standalone "$C" train "${cnn[@]}" --output-dir "$d/run" >"$d/run.log" 2>&1 ||
    die "ctrain run failed: $(cat "$d/run.log")"
python3 tests/tools/weights_close.py "$d/mpi/model.safetensors" "$d/run/model.safetensors" 1e-5 ||
    die "mpirun's weights differ from ctrain run's"
# an explicit world of one under a 2-process launcher: refused at once, naming both variables
out=$(timeout 60 mpirun -np 2 --oversubscribe -x WORLD_SIZE=1 "$C" train "${cnn[@]}" --output-dir "$d/one" 2>&1) &&
    die "WORLD_SIZE=1 under mpirun -np 2 ran: $out"
echo "$out" | grep -q "WORLD_SIZE=1 but OMPI_COMM_WORLD_SIZE=2" || die "unclear refusal: $out"
[ ! -e "$d/one/model.safetensors" ] || die "a refused job wrote weights"
echo ok
