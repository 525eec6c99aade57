#!/usr/bin/env bash
# All-reduce benchmark on this machine, in one run: ctrain's shm backend against Open MPI's
# MPI_Allreduce and PyTorch's gloo (/usr/bin/python3, torch 1.13), 2 ranks and 4 ranks (4 on
# however many cores there are: on a 2-core machine, oversubscribed; Open MPI with
# --oversubscribe). ROUNDS rounds (default 3), the libraries interleaved within each round so
# that a change in the machine's load hits all of them; each figure is the median over the
# rounds, with every round's value and load average kept. Also one core's memcpy bandwidth
# (the ceiling) and the wall time of a trivial 2-rank job under each launcher.
# Prints markdown tables for docs/bench/collectives.md; the raw figures stay in
# build/bench/allreduce.txt (ALLREDUCE_OUT=) as "impl ranks bytes time_us busbw_gbs round".
# Usage: bench/allreduce.sh            (after make)   ROUNDS=5 bench/allreduce.sh
set -u
cd "$(dirname "$0")/.." || exit 1
B=build/ctrain
PY=${TORCH_PYTHON:-/usr/bin/python3}
ROUNDS=${ROUNDS:-3}
NPS=${NPS:-2 4} # rank counts measured
SIZES="8 1048576 16777216 67108864"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p build/bench
have_mpi=0; have_gloo=0
if command -v mpicc >/dev/null && mpicc -O2 -o "$tmp/mpi_allreduce" bench/mpi/mpi_allreduce.c; then have_mpi=1; fi
$PY -c "import torch.distributed" 2>/dev/null && have_gloo=1

# one line per measurement: "impl np size time_us busbw_gbs round"
R=${ALLREDUCE_OUT:-build/bench/allreduce.txt}; : >"$R"
ctrain_run() { # np round
    { $B bench allreduce --np "$1" -b 8 -e 8 -n 2000; $B bench allreduce --np "$1" -b 1M -e 64M -f 4; } 2>/dev/null |
        awk -v np="$1" -v r="$2" '!/^#/ && ($1 == 8 || $1 == 1048576 || $1 == 16777216 || $1 == 67108864) {print "ctrain", np, $1, $5, $7, r}' >>"$R"
}
mpi_run() {
    local extra=(); [ "$1" -gt "$(nproc)" ] && extra=(--oversubscribe)
    mpirun -np "$1" "${extra[@]}" "$tmp/mpi_allreduce" $SIZES 2>/dev/null | awk -v np="$1" -v r="$2" '$1 == "mpi" {print "mpi", np, $2, $3, $4, r}' >>"$R"
}
gloo_run() {
    GLOO_NP=$1 $PY bench/gloo_allreduce.py $((30000 + RANDOM % 20000)) $SIZES 2>"$tmp/gerr" |
        awk -v np="$1" -v r="$2" '$1 == "gloo" {print "gloo", np, $2, $3, $4, r}' >>"$R" || cat "$tmp/gerr" >&2
}
loads=()
for r in $(seq "$ROUNDS"); do
    for np in $NPS; do
        ctrain_run $np $r
        [ $have_mpi = 1 ] && mpi_run $np $r
        [ $have_gloo = 1 ] && gloo_run $np $r
    done
    loads+=("$(cut -d' ' -f1 /proc/loadavg)")
done
copy=$($B bench copy | awk '$1 == 16777216 {print $3}')

# launcher wall time for a job that only initialises and finalises (best of 5)
best_of() { sort -n | head -1; }
wall() { for k in 1 2 3 4 5; do s=$(date +%s.%N); "$@" >/dev/null 2>&1; echo "$(date +%s.%N) - $s" | bc -l; done | best_of; }
w_ctrain=$(wall $B run --standalone --nproc-per-node 2 $B worker init)
w_mpirun=$( [ $have_mpi = 1 ] && wall mpirun -np 2 "$tmp/mpi_allreduce" init || echo n/a)

# med: the median of field f (4 = time, 5 = busbw); cell: "**median** (round 1 / round 2 / ...)"
vals() { awk -v i="$1" -v n="$2" -v s="$3" -v f="$4" '$1 == i && $2 == n && $3 == s {print $f}' "$R"; }
med() { vals "$@" | sort -g | awk '{v[NR] = $1} END { if (!NR) print 0; else print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
cell() {
    local all; all=$(vals "$@" | paste -sd/ - | sed 's|/| / |g')
    [ -n "$all" ] && printf "**%.3g** (%s)" "$(med "$@")" "$all" || echo n/a
}
model=$(lscpu | sed -n 's/^Model name: *//p'); fam=$(lscpu | sed -n 's/^CPU family: *//p'); mod=$(lscpu | sed -n 's/^Model: *//p')
echo "Machine: $model (family $fam model $mod), $(nproc) cores ($(uname -r)), $(date -u +%Y-%m-%dT%H:%MZ); $ROUNDS rounds, load average (1 min) after each: ${loads[*]}"
for np in $NPS; do
    echo
    echo "| $np ranks on $(nproc) cores, f32 sum | ctrain shm | Open MPI$([ $np -gt "$(nproc)" ] && echo ' --oversubscribe') | gloo | ctrain ÷ Open MPI |"
    echo "|---|---|---|---|---|"
    for s in $SIZES; do
        if [ $s = 8 ]; then
            c=$(med ctrain $np 8 4); m=$(med mpi $np 8 4)
            printf "| 8 B latency, µs | %s | %s | %s | %s |\n" "$(cell ctrain $np 8 4)" "$(cell mpi $np 8 4)" "$(cell gloo $np 8 4)" \
                "$(awk -v c="$c" -v m="$m" 'BEGIN { if (c > 0 && m > 0) printf "%.2f× the time", c / m; else print "n/a" }')"
        else
            c=$(med ctrain $np $s 5); m=$(med mpi $np $s 5)
            printf "| %s MiB busbw, GB/s | %s | %s | %s | %s |\n" $((s >> 20)) "$(cell ctrain $np $s 5)" "$(cell mpi $np $s 5)" "$(cell gloo $np $s 5)" \
                "$(awk -v c="$c" -v m="$m" 'BEGIN { if (c > 0 && m > 0) printf "%.2f×", c / m; else print "n/a" }')"
        fi
    done
done
echo
echo "- medians in bold, then each round's value in order; ctrain is \`ctrain bench allreduce --np N\` (default settings), Open MPI \`mpirun -np N\` (its default binding), gloo \`bench/gloo_allreduce.py\`"
echo "- copy ceiling (one core, memcpy 16 MiB): $copy GB/s"
printf -- "- trivial 2-rank job wall time (best of 5): ctrain run %.3f s, mpirun %s s\n" "$w_ctrain" "$w_mpirun"
