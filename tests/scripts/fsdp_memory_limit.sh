#!/usr/bin/env bash
# A GPT (25.4M parameters, 8 blocks of width 512) on 4 gloo ranks under an address-space
# limit per rank (ulimit -v, RLIMIT_AS) set just above what `--shard full` measured (VmPeak)
# and below what DDP measured: DDP runs out of memory, FULL_SHARD trains to the bits of the
# unlimited DDP run. The limits are derived from this machine's measured peaks, not fixed.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=${CT_BUILD:-build}/ctrain
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
die() { echo "$*"; exit 1; }
unset WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE
for i in $(seq 1 120); do echo "line $i of a text with $((i*7 % 31)) words and $((i*13 % 17)) commas,"; done > "$d/t.txt"
gpt=(gpt --text "$d/t.txt" --n-layer 8 --n-embd 512 --n-head 8 --block-size 64 --batch-size 2 --steps 2 --log-every 1
     --eval-every 0 --eval-max 8 --threads 1)
train() { # NAME ARGS...: 4 gloo ranks; the exit status is the run's
    local name=$1; shift
    CTRAIN_BACKEND=gloo timeout 600 "$C" run --nproc-per-node 4 --standalone "$C" train "${gpt[@]}" "$@" \
        --output-dir "$d/$name" > "$d/$name.log" 2>&1
}
vmpeak() { sed -n 's/^memory per rank.*(VmPeak) \([0-9.]*\) MB$/\1/p' "$d/$1.log"; }
rss() { sed -n 's/^memory per rank, max over ranks: peak RSS \([0-9.]*\) MB.*/\1/p' "$d/$1.log"; }
train ddp || die "DDP: $(tail -20 "$d/ddp.log")"
train full --shard full || die "--shard full: $(tail -20 "$d/full.log")"
vd=$(vmpeak ddp); vf=$(vmpeak full)
# resident memory: the shards, one unit and the step's activations; no rank ever holds the
# whole model (sharded initialisation, evaluation and the final save a unit at a time), so
# FULL_SHARD's peak is well under DDP's (212 against 450 MB measured)
rd=$(rss ddp); rf=$(rss full)
awk -v f="$rf" -v dd="$rd" 'BEGIN { exit !(f > 0 && f < 0.6 * dd) }' || die "peak RSS: FULL_SHARD $rf MB, DDP $rd MB"
[ -n "$vd" ] && [ -n "$vf" ] || die "no memory line: $(tail -3 "$d/ddp.log" "$d/full.log")"
# 25 MB above FULL_SHARD's peak; it must stay below DDP's
limit=$(awk -v f="$vf" 'BEGIN { printf "%d", (f + 25) * 1024 }')
awk -v l="$limit" -v dd="$vd" 'BEGIN { exit !(l / 1024 < dd) }' || die "no room: FULL_SHARD peak $vf MB, DDP $vd MB"
(ulimit -v "$limit"; train ddp_limited) && die "DDP trained within $((limit / 1024)) MB (its peak unlimited: $vd MB)"
grep -q "out of memory" "$d/ddp_limited.log" || die "DDP failed for another reason: $(tail -20 "$d/ddp_limited.log")"
(ulimit -v "$limit"; train full_limited --shard full) || die "--shard full within $((limit / 1024)) MB: $(tail -20 "$d/full_limited.log")"
cmp "$d/ddp/model.safetensors" "$d/full_limited/model.safetensors" || die "the limited FULL_SHARD run differs from DDP"
diff <(grep -o '"train/loss": [0-9.e+-]*' "$d/ddp/metrics.jsonl") <(grep -o '"train/loss": [0-9.e+-]*' "$d/full_limited/metrics.jsonl") ||
    die "losses differ"
echo "RLIMIT_AS $((limit / 1024)) MB per rank: DDP (peak $vd MB unlimited) out of memory; --shard full (peak $vf MB) trained, DDP's bits"
echo "peak RSS per rank: DDP $rd MB, --shard full $rf MB"
grep -h "^fsdp:\|^memory" "$d/full_limited.log"
grep -h "^memory" "$d/ddp.log"
