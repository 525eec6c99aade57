#!/usr/bin/env bash
# DDP scaling efficiency on this machine: per-rank throughput of 2 ranks x 1 thread
# (build/bench/train_bench ddp, shm backend) over 1 rank x 1 thread, for the MLP, GPT and CNN,
# with the sharded optimizer step (the default) and without it (CTRAIN_DDP_SHARD_OPTIM=0).
# ROUNDS rounds (default 3), the three runs of a model interleaved within a round; prints the
# median efficiency with each round's value and the load average after each round.
# Raw figures: build/bench/ddp_scaling.txt (DDP_OUT=), "model round rate_1x1 rate_shard rate_allreduce".
# Each run lasts SECS seconds (default 5; 10 for the GPT, whose steps take about a second: in
# 5 s its 5 steps gave per-rank rates 10% apart from run to run on an AMD Zen 4).
# Usage: bench/ddp_scaling.sh   (after make)   ROUNDS=5 SECS=8 bench/ddp_scaling.sh
set -u
cd "$(dirname "$0")/.." || exit 1
CT=build/bench/train_bench
ROUNDS=${ROUNDS:-3}
secs() { [ "$1" = gpt ] && echo "${SECS:-10}" || echo "${SECS:-5}"; }
MODELS=${MODELS:-mlp gpt cnn}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p build/bench
R=${DDP_OUT:-build/bench/ddp_scaling.txt}
rate() { "$@" 2>/dev/null | sed -n 's/^RESULT.* rate=\([0-9.]*\).*/\1/p' | tail -1; }
loads=()
: >"$R"
for r in $(seq "$ROUNDS"); do
    for m in $MODELS; do
        one=$(rate "$CT" single $m 1 "$(secs $m)")
        sh=$(rate "$CT" ddp $m 2 "$(secs $m)")
        ar=$(rate env CTRAIN_DDP_SHARD_OPTIM=0 "$CT" ddp $m 2 "$(secs $m)")
        echo "$m $r ${one:-0} ${sh:-0} ${ar:-0}" >>"$R"
    done
    loads+=("$(cut -d' ' -f1 /proc/loadavg)")
done
echo "DDP scaling, $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ); $ROUNDS rounds of ${SECS:-5} s runs (the GPT ${SECS:-10} s), load average (1 min) after each: ${loads[*]}"
echo
echo "| model | 1 rank × 1 thread (rate) | efficiency, sharded optimizer step (default) | efficiency, all-reduce only (CTRAIN_DDP_SHARD_OPTIM=0) |"
echo "|---|---|---|---|"
col() { awk -v m="$1" -v f="$2" '$1 == m { if (f == 3) print $3; else printf "%.3f\n", ($3 > 0 ? $f / $3 : 0) }' "$R"; }
med() { sort -g | awk '{v[NR] = $1} END { if (!NR) print 0; else print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
cell() { # rates as integers, efficiencies with 2 decimals
    local f="%.2f"; [ "$2" = 3 ] && f="%.0f"
    printf "**$f** (%s)" "$(col "$1" "$2" | med)" "$(col "$1" "$2" | xargs printf "$f\n" | paste -sd/ - | sed 's|/| / |g')"
}
for m in $MODELS; do
    printf "| %s | %s | %s | %s |\n" "$m" "$(cell $m 3)" "$(cell $m 4)" "$(cell $m 5)"
done
echo
echo "- efficiency = per-rank rate at 2 ranks ÷ the rate of 1 rank, both 1 thread, in the same round; medians in bold"
