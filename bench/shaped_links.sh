#!/usr/bin/env bash
# Multi-host figures over links that cost what a network costs: N "hosts" (network namespaces,
# each with its own /dev/shm) on a switch (a bridge in another namespace), every host's link
# shaped by a token-bucket filter (tc tbf) on both ends of its veth, so each host sends and
# receives at most RATE (1gbit, 10gbit, 25gbit; "none": the bare veth). netem (delay) is not
# in this kernel ("Specified qdisc kind is unknown"), so the links add no latency.
# For each rate in RATES (default "none 25gbit 10gbit 1gbit"), what MODES says (default all):
#   bulk   one TCP stream host 1 -> host 0 for BULK_SECONDS (default 3): the rate the shaping holds
#   coll   ctrain bench allreduce/allgather/reducescatter, 2 hosts x 1 rank (flat Gloo),
#          2 hosts x 2 ranks (hier: shm inside, Gloo between the leaders; allreduce), 4 hosts x
#          1 rank (flat Gloo): time per call for 1, 4, 16, 64 MiB; the hier all-reduce both
#          ways: allreduce-ordered (CTRAIN_HIER_ALLREDUCE=ordered, the default: host 0's leader
#          to host 1's and back, bit-identical to one host) and allreduce (rail: local rank i of
#          every host all-reduces slice i over its own Gloo ring, both directions at once)
#   train  ctrain train vs PyTorch DDP (gloo, bench/torch_train.py under torchrun), MLP and GPT
#          of bench/multinode.sh (TRAIN_MODELS, default "mlp gpt"; cnn: the CNN too), LAYOUTS
#          (default "2x2": hosts x ranks per host); ctrain with its defaults (the hier backend's
#          ordered sum, the sharded optimizer step across machines; HIER=rail:
#          CTRAIN_HIER_ALLREDUCE, CTRAIN_DDP_SHARD_HIER=0: DDP's overlapped all-reduce instead)
#          and --grad-compression bf16 (COMPRESS=none: f32). TRAIN_MODELS=gptfsdp: the GPT with
#          ctrain --shard full against PyTorch FSDP (FULL_SHARD, one unit per block, gloo)
# and once, unshaped, MODES=base: the same training on one host (1 rank; LAYOUTS' ranks on one
# host), for the efficiency and the cost model's compute.
# One line per result, appended to OUT (default bench/shaped_links.out) and printed:
#   bulk RATE gbit_s=X
#   coll RATE HxR COLL BYTES us=T busbw=B med_us=M   (T the mean call, M the median call)
#   train RATE HxR IMPL MODEL rate=R step_ms=S [compute_ms= allreduce_ms= hidden_pct=]
# bench/cost_model.py reads that file. Everything shares this machine's cores: 2 hosts x 2 ranks
# on 2 cores are 4 processes on 2 cores; CTRAIN_SHM_SPIN_US=2 as bench/multinode.sh, and
# CTRAIN_BIND=0 unless set: each "host" would pin its local rank 0 to the same core 0 (on
# machines of their own the pinning stays on).
# Usage: [RATES=...] [MODES="bulk coll train base"] [PYTHON=...] [OUT=...] bench/shaped_links.sh
set -u
cd "$(dirname "$0")/.." || exit 1
C=$PWD/${CT_BUILD:-build}/ctrain
PY=${PYTHON:-/work/main/build/venv-bench/bin/python}
OUT=${OUT:-$PWD/bench/shaped_links.out}
skip() { echo "$*"; exit 77; }
die() { echo "FAIL: $*"; exit 1; }
[ -x "$C" ] || die "no $C (make first)"
"$PY" -c "import torch.distributed.run" 2>/dev/null || skip "no PyTorch with torchrun at PYTHON=$PY"
data=${CTRAIN_DATA_DIR:-/usr/share/datasets/fashion-mnist}
[ -r "$data/train-images-idx3-ubyte.gz" ] || skip "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"
text=${TEXT:-/usr/share/common-licenses/GPL-3}
tmp=$(mktemp -d)
net=${SHAPED_NET:-10.77.0}
p=sl$$ # names of this run's namespaces and links
NH=4   # hosts on the switch; a job uses the first 2 or 4
cleanup() {
    for k in $(seq 0 $((NH - 1))); do ip netns pids $p-h$k 2>/dev/null | xargs -r kill -9 2>/dev/null; done
    for k in $(seq 0 $((NH - 1))); do ip netns del $p-h$k 2>/dev/null; done
    ip netns del $p-sw 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add $p-sw || skip "cannot create network namespaces here"
ip -n $p-sw link add br0 type bridge && ip -n $p-sw link set br0 up || die "bridge"
ip -n $p-sw link set lo up
for k in $(seq 0 $((NH - 1))); do
    ip netns add $p-h$k || die "namespace $k"
    ip link add $p-e$k type veth peer name $p-s$k || die "veth $k"
    ip link set $p-e$k netns $p-h$k && ip link set $p-s$k netns $p-sw || die "moving veth $k"
    ip -n $p-h$k link set $p-e$k name eth0 || die "rename"
    ip -n $p-h$k addr add $net.$((k + 1))/24 dev eth0 || die "address $k"
    ip -n $p-h$k link set lo up && ip -n $p-h$k link set eth0 up || die "link up $k"
    ip -n $p-sw link set $p-s$k master br0 && ip -n $p-sw link set $p-s$k up || die "switch port $k"
done
. <(sed -n '/^tc_burst()/,/^}/p' tests/tools/two_hosts.sh) # the same burst as TWO_HOSTS_RATE
# set_rate RATE|none: both directions of every host's link
set_rate() {
    local k
    for k in $(seq 0 $((NH - 1))); do
        if [ "$1" = none ]; then
            ip netns exec $p-h$k tc qdisc del dev eth0 root 2>/dev/null
            ip netns exec $p-sw tc qdisc del dev $p-s$k root 2>/dev/null
        else
            ip netns exec $p-h$k tc qdisc replace dev eth0 root tbf rate "$1" burst "$(tc_burst "$1")" latency 50ms &&
                ip netns exec $p-sw tc qdisc replace dev $p-s$k root tbf rate "$1" burst "$(tc_burst "$1")" latency 50ms ||
                die "tc tbf $1 on host $k"
        fi
    done
}
# in_host K CMD...: CMD in host K's namespace with its own /dev/shm
in_host() {
    local k=$1; shift
    ip netns exec $p-h$k sh -c 'mount -t tmpfs ctshm /dev/shm && exec "$@"' sh "$@"
}
emit() { echo "$*" | tee -a "$OUT"; }
export CTRAIN_SHM_SPIN_US=2 CTRAIN_BIND=${CTRAIN_BIND:-0} OMP_NUM_THREADS=1 CTRAIN_HIER_ALLREDUCE=${HIER:-ordered}
port=29800
secret=$tmp/secret # the store's secret, in a 0600 file
od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$secret"; chmod 600 "$secret"

# ctrain_on H R LOG CMD...: `ctrain run --nnodes H --nproc-per-node R` on hosts 0..H-1; LOG.k per host
ctrain_on() {
    local h=$1 r=$2 log=$3 k pids=() rc=0; shift 3
    port=$((port + 1))
    for k in $(seq 0 $((h - 1))); do
        in_host $k timeout 900 "$C" run --nnodes $h --nproc-per-node $r --node-rank $k --master-addr $net.1 \
            --master-port $port --rdzv-token-file "$secret" "$@" >"$log.$k" 2>&1 &
        pids+=($!)
    done
    for k in "${pids[@]}"; do wait $k || rc=1; done
    return $rc
}
torch_on() {
    local h=$1 r=$2 log=$3 k pids=() rc=0; shift 3
    port=$((port + 1))
    for k in $(seq 0 $((h - 1))); do
        in_host $k env GLOO_SOCKET_IFNAME=eth0 timeout 900 "$PY" -m torch.distributed.run --nnodes $h \
            --node-rank $k --nproc-per-node $r --master-addr $net.1 --master-port $port "$@" >"$log.$k" 2>&1 &
        pids+=($!)
    done
    for k in "${pids[@]}"; do wait $k || rc=1; done
    return $rc
}
# global rate from ctrain's step lines, the first interval left out: harmonic mean of the rest
ctrain_rate() {
    grep -E '^step ' "$1" | sed -E 's/.*\| ([0-9.]+) (samples|tokens)\/s.*/\1/' | tail -n +2 |
        awk '{ s += 1 / $1; n++ } END { if (n) printf "%.1f", n / s; else print "?" }'
}
# "compute_ms=X allreduce_ms=Y hidden_pct=Z" from ctrain's ddp summary line, if any
# (the sharded step, CTRAIN_DDP_SHARD_HIER=1, the default: "compute_ms=X wait_ms=Y")
ddp_fields() {
    grep -m1 '^ddp:' "$1" | sed -E -e 's/.*compute ([0-9.]+) ms, all-reduce ([0-9.]+) ms, ([0-9]+)% .*/compute_ms=\1 allreduce_ms=\2 hidden_pct=\3/' \
        -e 's/.*compute ([0-9.]+) ms, waiting for peers ([0-9.]+) ms.*/compute_ms=\1 wait_ms=\2/'
}

gpt=(--n-layer 6 --n-embd 256 --n-head 8 --block-size 256 --vocab-size 256 --batch-size 8 --text "$text"
     --steps ${GPT_STEPS:-12} --log-every 3)
mlp=(--hidden 1024,1024 --batch-size 128 --data-dir "$data" --steps ${MLP_STEPS:-80} --log-every 20)
cnn=(--batch-size 128 --data-dir "$data" --steps ${CNN_STEPS:-40} --log-every 10) # bench/torch_train.py's batch
# gptfsdp: the GPT fully sharded, ctrain --shard full against PyTorch FSDP FULL_SHARD (gloo)
gptfsdp=("${gpt[@]}" --shard full ${FSDP_ARGS:-}) # FSDP_ARGS: e.g. --shard-prefetch
kind_of() { [ "$1" = gptfsdp ] && echo gpt || echo "$1"; }
common=(--threads 1 --eval-max 16)
items() { case $1 in mlp|cnn) echo 128 ;; *) echo $((8 * 256)) ;; esac; } # per rank and step
# train_one RATE H R MODEL: ctrain then PyTorch, H hosts x R ranks
train_one() {
    local rate=$1 h=$2 r=$3 m=$4 n=$(($2 * $3)) cr tl tr k tm=ddp
    eval "local margs=(\"\${$m[@]}\")"
    k=$(kind_of $m)
    local mz=(${cz[@]+"${cz[@]}"})
    [ $m = gptfsdp ] && { mz=(); tm=fsdp; } # the shards travel in f32 (no gradient compression)
    [ $n = 1 ] && [ $m = gptfsdp ] && margs=("${gpt[@]}") # one rank: nothing to shard
    if [ "$h" = 1 ]; then # one host: the same launchers without --nnodes
        in_host 0 timeout 900 "$C" run --standalone --nproc-per-node $r "$C" train $k "${margs[@]}" "${common[@]}" \
            ${mz[@]+"${mz[@]}"} --output-dir "$tmp/o" >"$tmp/c.0" 2>&1 || die "ctrain $m 1x$r: $(tail -3 "$tmp/c.0")"
    else
        ctrain_on $h $r "$tmp/c" "$C" train $k "${margs[@]}" "${common[@]}" ${mz[@]+"${mz[@]}"} --output-dir "$tmp/o" ||
            die "ctrain $m ${h}x$r at $rate: $(tail -3 "$tmp/c.0" "$tmp/c.1")"
    fi
    cr=$(ctrain_rate "$tmp/c.0")
    emit "train $rate ${h}x$r ctrain $m rate=$cr step_ms=$(awk -v g=$((n * $(items $m))) -v c="$cr" \
        'BEGIN { printf "%.2f", 1e3 * g / c }') $(ddp_fields "$tmp/c.0")"
    # PyTorch once more if its run fails (2026-12-05: one SIGABRT in 2 x 2 on Gloo, not
    # repeated), the failure said on stderr; a second failure ends the run
    local try
    for try in 1 2; do
        if [ "$n" = 1 ]; then
            in_host 0 "$PY" bench/torch_train.py single $k 1 "${TORCH_SECONDS:-10}" >"$tmp/t.0" 2>&1
        elif [ "$h" = 1 ]; then
            in_host 0 "$PY" bench/torch_train.py $tm $k $n "${TORCH_SECONDS:-10}" >"$tmp/t.0" 2>&1
        else
            torch_on $h $r "$tmp/t" bench/torch_train.py $([ $tm = fsdp ] && echo torchrun-fsdp || echo torchrun) $k 0 \
                "${TORCH_SECONDS:-10}"
        fi && break
        [ $try = 2 ] && die "torch $m ${h}x$r at $rate: $(tail -3 "$tmp/t.0")"
        echo "torch $m ${h}x$r at $rate failed, run again: $(grep -m3 -iE 'error|signal|abort' "$tmp"/t.* | tr '\n' ' ')" >&2
    done
    tl=$(grep RESULT "$tmp/t.0") || die "torch $m: no result: $(tail -3 "$tmp/t.0")"
    emit "train $rate ${h}x$r pytorch $m rate=$(echo "$tl" | sed -E 's/.* rate=([0-9.]+) .*/\1/' |
        awk -v n=$n '{ printf "%.1f", n * $1 }') step_ms=$(echo "$tl" | sed -E 's/.* step_ms=([0-9.]+) .*/\1/')"
}
cz=(--grad-compression "${COMPRESS:-bf16}")
[ "${COMPRESS:-bf16}" = none ] && cz=()
# coll_one RATE H R COLL [LABEL]: 1 and 4 MiB over COLL_ITERS_SMALL calls (default 40) in each
# of COLL_LAUNCHES_SMALL launches (default 3), 16 and 64 MiB over COLL_ITERS (default 5) in one.
# A 1 MiB call takes 1-10 ms here, about a scheduler time slice of 4-5 processes on 2 cores:
# over 5 calls one slice more or less moved the mean by tens of percent (the runs of
# 2026-12-05: 1.4-4.0 ms for the same 2 x 1 all-gather); the median call (med_us) leaves those
# slices out. A launch sets where the processes' threads run and in what phase they meet, and
# a 1 MiB call kept that launch's pace: the same 2 x 2 ordered all-reduce on the bare veth, four
# launches in a row, 2026-12-05 23:49 UTC, median calls 1.84, 3.32, 2.05, 2.08 ms. So the small
# sizes are launched 3 times and med_us is the median of the launches' medians (us: the mean
# of their means; launches=N says how many, med_lo and med_hi the least and greatest median).
coll_one() {
    local sizes L
    for sizes in "1M 4M ${COLL_ITERS_SMALL:-40} ${COLL_LAUNCHES_SMALL:-3}" "16M 64M ${COLL_ITERS:-5} 1"; do
        set -- "$1" "$2" "$3" "$4" "${5:-$4}" $sizes
        local b=(bench $4 -b $6 -e $7 -f 4 -n $8 -w 2)
        : >"$tmp/runs"
        for L in $(seq "$9"); do
            if [ "$2" = 1 ]; then
                in_host 0 timeout 900 "$C" run --standalone --nproc-per-node $3 "$C" "${b[@]}" >"$tmp/a.0" 2>&1
            else
                ctrain_on $2 $3 "$tmp/a" "$C" "${b[@]}"
            fi || die "bench $4 ${2}x$3 at $1: $(tail -3 "$tmp/a.0" "$tmp/a.1")"
            grep -E '^ *[0-9]+ ' "$tmp/a.0" >>"$tmp/runs"
        done
        # per size: the mean of the launches' mean calls, the median of their median calls
        awk '{ n[$1]++; us[$1] += $5; bw[$1] += $7; med[$1, n[$1]] = $9; if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 } }
             END { for (i = 1; i <= k; i++) { s = order[i]; c = n[s]
                       for (a = 1; a <= c; a++) v[a] = med[s, a]
                       for (a = 2; a <= c; a++) for (b = a; b > 1 && v[b - 1] > v[b]; b--) { t = v[b]; v[b] = v[b - 1]; v[b - 1] = t }
                       m = c % 2 ? v[(c + 1) / 2] : (v[c / 2] + v[c / 2 + 1]) / 2; u = us[s] / c
                       printf "%s %.2f %.3f %.2f %d %.2f %.2f\n", s, u, bw[s] / c, m, c, v[1], v[c] } }' "$tmp/runs" |
            while read -r bytes us bus med nl lo hi; do
                emit "coll $1 ${2}x$3 $5 $bytes us=$us busbw=$bus med_us=$med$([ "$nl" -gt 1 ] &&
                    echo " launches=$nl med_lo=$lo med_hi=$hi")"
            done
    done
}

MODES=${MODES:-bulk coll train base}
emit "# $(date -u '+%F %H:%M UTC') | $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(getconf _NPROCESSORS_ONLN) cores |" \
     "load $(cut -d' ' -f1-3 /proc/loadavg) | torch $("$PY" -c 'import torch; print(torch.__version__)') | compress ${COMPRESS:-bf16} | hier ${HIER:-ordered} | bind $CTRAIN_BIND | shard_hier ${CTRAIN_DDP_SHARD_HIER:-1} | chain_early ${CTRAIN_HIER_CHAIN_EARLY:-1}"
for rate in ${RATES:-none 25gbit 10gbit 1gbit}; do
    set_rate $rate
    for mode in $MODES; do
        case $mode in
        bulk)
            in_host 0 /usr/bin/python3 bench/bulk_rate.py recv $net.1 $((port + 500)) >"$tmp/bulk" 2>&1 &
            sleep 0.5
            in_host 1 /usr/bin/python3 bench/bulk_rate.py send $net.1 $((port + 500)) "${BULK_SECONDS:-3}" ||
                die "bulk sender"
            wait $! || die "bulk receiver: $(cat "$tmp/bulk")"
            emit "bulk $rate $(cat "$tmp/bulk")" ;;
        coll)
            for c in allreduce allgather reducescatter; do coll_one $rate 2 1 $c; coll_one $rate 4 1 $c; done
            CTRAIN_HIER_ALLREDUCE=ordered coll_one $rate 2 2 allreduce allreduce-ordered
            CTRAIN_HIER_ALLREDUCE=rail coll_one $rate 2 2 allreduce ;;
        train)
            for l in ${LAYOUTS:-2x2}; do
                for m in ${TRAIN_MODELS:-mlp gpt}; do train_one $rate ${l%x*} ${l#*x} $m; done
            done ;;
        esac
    done
done
if [[ " $MODES " = *" base "* ]]; then
    set_rate none
    coll_one one 1 2 allreduce # shm inside a host, for the hierarchical model
    for m in ${TRAIN_MODELS:-mlp gpt}; do
        train_one one 1 1 $m
        for l in ${LAYOUTS:-2x2}; do train_one one 1 $((${l%x*} * ${l#*x})) $m; done
    done
fi
