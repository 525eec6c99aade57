#!/usr/bin/env bash
# The README's demo against the same training in PyTorch (bench/demo_torch.py under torchrun):
# 2 epochs of the CNN on Fashion-MNIST, 2 ranks x 1 thread, run ROUNDS times each, interleaved
# (ctrain, PyTorch, ctrain, PyTorch, ...) since this machine is shared. One line per run: the
# command's wall time (launcher, start-up and data loading included), the test accuracy after
# the last epoch, the CPU time of the whole command and the load average before and after.
#
#   bash bench/demo.sh            # ~5 min on 2 cores; results in build/bench/demo/results.txt
# Environment: PYTHON (the PyTorch interpreter, default as bench/run.sh: build/venv-bench,
# installed there on first use), ROUNDS (default 2), EPOCHS (default 2), CTRAIN_DATA_DIR,
# SEEDS (default 1337; several, e.g. SEEDS="1337 1 2 3 4", run each seed in every round and end
# with each side's mean accuracy over the seeds: the two libraries draw their initial weights
# from different random streams, so one seed compares two draws, not two trainers).
set -u
cd "$(dirname "$0")/.." || exit 1
ROUNDS=${ROUNDS:-2}
SEEDS=${SEEDS:-1337}
EPOCHS=${EPOCHS:-2}
OUT=${DEMO_OUT:-build/bench/demo}
PY=${PYTHON:-${BENCH_VENV:-build/venv-bench}/bin/python}
if ! "$PY" -c 'import torch' 2>/dev/null; then
    # bench/run.sh owns the installation of the reference PyTorch
    [ -n "${PYTHON:-}" ] && { echo "demo: PYTHON=$PY cannot import torch" >&2; exit 1; }
    bash bench/run.sh --setup-only || exit 1
fi
[ -x build/ctrain ] || { echo "build first: make -j2" >&2; exit 1; }
data=${CTRAIN_DATA_DIR:-/usr/share/datasets/fashion-mnist}
[ -r "$data/train-images-idx3-ubyte.gz" ] || [ -r "$data/train-images-idx3-ubyte" ] ||
    { echo "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)" >&2; exit 1; }
TORCHRUN=("$(dirname "$PY")/torchrun")
[ -x "${TORCHRUN[0]}" ] || TORCHRUN=("$PY" -m torch.distributed.run)
mkdir -p "$OUT"
: >"$OUT/results.txt"
load() { cut -d' ' -f1-3 /proc/loadavg | tr ' ' /; }
echo "MACHINE cpu=\"$(lscpu | sed -n 's/^Model name: *//p')\" cores=$(nproc) torch=$("$PY" -c 'import torch; print(torch.__version__)') date=$(date -u +%FT%TZ)" |
    tee -a "$OUT/results.txt"

# one timed command: wall seconds, CPU seconds (user+sys of it and its children), accuracy
timed() {
    local impl=$1 log=$2; shift 2
    local l0; l0=$(load)
    /usr/bin/time -f 'TIME wall=%e user=%U sys=%S' -o "$log.time" "$@" >"$log" 2>&1 || {
        echo "demo: $impl FAILED: $*" >&2; tail -5 "$log" >&2; return 1; }
    local acc; acc=$(grep -oE 'accuracy[ =]+[0-9.]+' "$log" | tail -1 | grep -oE '[0-9.]+$')
    local w u s; read -r w u s < <(sed -n 's/^TIME wall=\([0-9.]*\) user=\([0-9.]*\) sys=\([0-9.]*\)/\1 \2 \3/p' "$log.time")
    echo "RESULT impl=$impl seed=$seed wall_s=$w cpu_s=$(awk "BEGIN{print $u+$s}") accuracy=${acc:-?} load_before=$l0 load_after=$(load)" |
        tee -a "$OUT/results.txt"
}

for r in $(seq "$ROUNDS"); do
    for seed in $SEEDS; do
        rm -rf "$OUT/ctrain-out"
        timed ctrain "$OUT/ctrain.$r.$seed.log" build/ctrain run --nproc-per-node 2 build/ctrain train cnn --epochs "$EPOCHS" \
            --seed "$seed" --data-dir "$data" --output-dir "$OUT/ctrain-out"
        timed pytorch "$OUT/pytorch.$r.$seed.log" env -u OMP_NUM_THREADS "${TORCHRUN[@]}" --standalone --nproc-per-node 2 \
            bench/demo_torch.py --epochs "$EPOCHS" --seed "$seed" --data-dir "$data"
    done
done
# each side's accuracy averaged over the seeds (a seed's runs give the same accuracy every round)
awk '/^RESULT/ { for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
                 k = f["impl"] " " f["seed"]; if (!(k in acc)) { acc[k] = f["accuracy"]; n[f["impl"]]++; sum[f["impl"]] += f["accuracy"] } }
     END { for (m in n) printf "MEAN impl=%s seeds=%d accuracy=%.4f\n", m, n[m], sum[m] / n[m] }' "$OUT/results.txt" | sort |
    tee -a "$OUT/results.txt"
