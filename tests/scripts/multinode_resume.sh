#!/usr/bin/env bash
# `--resume auto` with an output directory per node (two "nodes" on this machine: two
# `ctrain run --nnodes 2 --node-rank K` on loopback, one rank each). Only rank 0 writes
# checkpoints, so node 1's directory holds none: node 1 must get rank 0's state and the job
# end with the bits of a run on one shared directory, never train on mismatched states.
# A node holding a newer checkpoint than rank 0's is refused before step 1, naming the
# directories and the steps.
set -u
cd "$(dirname "$0")/../.." || exit 1
C=${CT_BUILD:-build}/ctrain
die() { echo "FAIL: $*"; exit 1; }
. tests/tools/fashion_mnist.sh
d=${KEEP_DIR:-$(mktemp -d)}; [ -n "${KEEP_DIR:-}" ] || trap 'rm -rf "$d"' EXIT
mlp=(train mlp --hidden 64,32 --steps 40 --batch-size 32 --eval-max 256 --save-every 20 --keep 5 --threads 1 --log-every 5)
port=$((29600 + RANDOM % 300))
# two nodes; $1: name, $2 and $3: node 0's and node 1's output directories, the rest: ctrain train flags
two_nodes() {
    local n=$1 o0=$2 o1=$3; shift 3
    local id=resume-$n
    # the store's secret from a 0600 file, never argv (docs/multinode.md)
    printf '0123456789abcdef-%s\n' "$n" > "$d/secret.$n"; chmod 600 "$d/secret.$n"
    timeout 120 $C run --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $port \
        --rdzv-id $id --rdzv-token-file "$d/secret.$n" $C "${mlp[@]}" --output-dir "$o0" "$@" > "$d/$n.0.log" 2>&1 &
    local p0=$!
    timeout 120 $C run --nnodes 2 --node-rank 1 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $port \
        --rdzv-id $id --rdzv-token-file "$d/secret.$n" $C "${mlp[@]}" --output-dir "$o1" "$@" > "$d/$n.1.log" 2>&1
    local r1=$?
    wait $p0; local r0=$?
    port=$((port + 1))
    echo "$r0 $r1"
}

# the reference: one directory for both nodes, 40 steps, checkpoints at 20 and 40
[ "$(two_nodes shared "$d/shared" "$d/shared")" = "0 0" ] || die "shared directory run: $(tail -n 5 "$d/shared.0.log" "$d/shared.1.log")"
test -d "$d/shared/checkpoints/step-00000020" || die "no checkpoint at step 20"

# a directory per node, rank 0's with the step-20 checkpoint, node 1's empty
mkdir -p "$d/n0/checkpoints" "$d/n1"
cp -r "$d/shared/checkpoints/step-00000020" "$d/n0/checkpoints/"
[ "$(two_nodes pernode "$d/n0" "$d/n1" --resume auto)" = "0 0" ] ||
    die "per-node directories: $(tail -n 5 "$d/pernode.0.log" "$d/pernode.1.log")"
grep -q "resumed from .*step-00000020 at step 20" "$d/pernode.0.log" || die "did not resume: $(head -5 "$d/pernode.0.log")"
grep -q "rank 1 on .*: no checkpoint under $d/n1/checkpoints: it gets rank 0's step 20" "$d/pernode.0.log" ||
    die "no warning naming node 1's directory: $(head -5 "$d/pernode.0.log")"
cmp "$d/shared/model.safetensors" "$d/n0/model.safetensors" || die "per-node resume differs from the shared-directory run"

# node 1 holds a newer checkpoint than rank 0: refused before any step, naming both
mkdir -p "$d/m0/checkpoints" "$d/m1/checkpoints"
cp -r "$d/shared/checkpoints/step-00000020" "$d/m0/checkpoints/"
cp -r "$d/shared/checkpoints/step-00000040" "$d/m1/checkpoints/"
rc=$(two_nodes newer "$d/m0" "$d/m1" --resume auto --steps 60)
[ "$rc" != "0 0" ] || die "mismatched checkpoints were trained on"
grep -q "^step " "$d/newer.0.log" && die "steps ran before the refusal: $(grep -m1 '^step ' "$d/newer.0.log")"
grep -q "rank 0 on .*: step 20 in $d/m0/checkpoints/step-00000020; rank 1 on .*: step 40 in $d/m1/checkpoints/step-00000040" \
    "$d/newer.0.log" || die "refusal does not name the directories and steps: $(tail -n 6 "$d/newer.0.log")"
test -e "$d/m0/model.safetensors" && die "weights written after a refusal"
echo "per-node directories: rank 1 took rank 0's step 20, weights equal the shared run's; a newer checkpoint on node 1 refused"
