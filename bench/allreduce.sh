#!/usr/bin/env bash
# All-reduce benchmark, 2 ranks on this machine, in one run: ctrain's shm backend against
# PyTorch's gloo (/usr/bin/python3, torch 1.13) and Open MPI's MPI_Allreduce, with one core's
# memcpy bandwidth as the ceiling; also the wall time of a trivial 2-rank job under each
# launcher. Prints a markdown table for docs/bench/collectives.md.
# Usage: bench/allreduce.sh            (after make)
set -u
cd "$(dirname "$0")/.." || exit 1
B=build/ctrain
PY=${TORCH_PYTHON:-/usr/bin/python3}
SIZES="8 1048576 16777216 67108864"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
declare -A T BW
best_of() { sort -n | head -1; }

# ctrain shm: best of 3 runs per size
for s in $SIZES; do
    for k in 1 2 3; do $B bench allreduce -b $s -e $s | grep -v '^#'; done >"$tmp/c"
    T[ctrain,$s]=$(awk '{print $5}' "$tmp/c" | best_of)
    BW[ctrain,$s]=$(awk '{print $7}' "$tmp/c" | sort -n | tail -1)
done
# fingerprint cost at 8 B
fp_off=$(for k in 1 2 3; do $B bench allreduce -b 8 -e 8 --no-fingerprint | grep -v '^#' | awk '{print $5}'; done | best_of)
async8=$(for k in 1 2 3; do $B bench allreduce -b 8 -e 8 --async | grep -v '^#' | awk '{print $5}'; done | best_of)

# Open MPI
if command -v mpicc >/dev/null; then
    mpicc -O2 -o "$tmp/mpi_allreduce" bench/mpi/mpi_allreduce.c
    for k in 1 2 3; do mpirun -np 2 "$tmp/mpi_allreduce" $SIZES 2>/dev/null; done >"$tmp/m"
    for s in $SIZES; do
        T[mpi,$s]=$(awk -v s=$s '$2 == s {print $3}' "$tmp/m" | best_of)
        BW[mpi,$s]=$(awk -v s=$s '$2 == s {print $4}' "$tmp/m" | sort -n | tail -1)
    done
fi
# gloo
if $PY -c "import torch.distributed" 2>/dev/null; then
    port=$((30000 + RANDOM % 20000))
    $PY bench/gloo_allreduce.py $port $SIZES >"$tmp/g" 2>"$tmp/gerr" || cat "$tmp/gerr" >&2
    for s in $SIZES; do
        T[gloo,$s]=$(awk -v s=$s '$2 == s {print $3}' "$tmp/g")
        BW[gloo,$s]=$(awk -v s=$s '$2 == s {print $4}' "$tmp/g")
    done
fi
copy=$($B bench copy | awk '$1 == 16777216 {print $3}')

# launcher wall time for a job that only initialises and finalises (best of 5)
wall() { for k in 1 2 3 4 5; do s=$(date +%s.%N); "$@" >/dev/null 2>&1; echo "$(date +%s.%N) - $s" | bc -l; done | best_of; }
w_ctrain=$(wall $B run --standalone --nproc-per-node 2 $B worker init)
w_mpirun=$( [ -x "$tmp/mpi_allreduce" ] && wall mpirun -np 2 "$tmp/mpi_allreduce" init || echo n/a)
cat >"$tmp/t.py" <<'PYEOF'
import torch.distributed as dist
dist.init_process_group("gloo"); dist.barrier(); dist.destroy_process_group()
PYEOF
w_torchrun=$(for k in 1 2; do s=$(date +%s.%N); $PY -m torch.distributed.run --standalone --nproc_per_node 2 "$tmp/t.py" >/dev/null 2>&1; echo "$(date +%s.%N) - $s" | bc -l; done | best_of)

model=$(lscpu | sed -n 's/^Model name: *//p'); cores=$(nproc)
echo "Machine: $model, $cores cores ($(uname -r)), $(date +%Y-%m-%d)"
echo
echo "| size | ctrain shm | Open MPI | gloo |"
echo "|---|---|---|---|"
for s in $SIZES; do
    if [ $s = 8 ]; then
        printf "| 8 B latency | %s µs | %s µs | %s µs |\n" "${T[ctrain,$s]}" "${T[mpi,$s]:-n/a}" "${T[gloo,$s]:-n/a}"
    else
        printf "| %s MiB busbw | %s GB/s | %s GB/s | %s GB/s |\n" $((s >> 20)) "${BW[ctrain,$s]}" "${BW[mpi,$s]:-n/a}" "${BW[gloo,$s]:-n/a}"
    fi
done
echo
echo "- copy ceiling (one core, memcpy 16 MiB): $copy GB/s"
echo "- ctrain 8 B with fingerprints off: $fp_off µs (on: ${T[ctrain,8]} µs); async issue + ct_work_wait: $async8 µs"
printf -- "- trivial 2-rank job wall time: ctrain run %.3f s, mpirun %s s, torchrun %.2f s\n" "$w_ctrain" "$w_mpirun" "$w_torchrun"
