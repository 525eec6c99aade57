#!/usr/bin/env bash
# Sharded checkpoints (--shard with --save-every / --resume): a GPT trained on 4 ranks with
# --shard full writes each rank's shard plus the index at step 10; resumed from it at 3
# ranks (gloo) and 2 ranks (shm, mpi), and unsharded on 1 rank, with the same global batch,
# every run continues with the uninterrupted run's losses within 1e-6. `ctrain export`
# assembles the sharded checkpoint into a model.safetensors bit-identical to the DDP run's
# checkpoint of the same step (and --hf a Hugging Face directory with the same test loss), which PyTorch loads with load_state_dict(strict=True) (when
# /usr/bin/python3 has torch); `ctrain eval` reads the sharded checkpoint directly. Bad
# checkpoints are refused before any step, naming the cause: a checkpoint of another
# model, a shard whose checksum differs. An unsharded (DDP) checkpoint resumes sharded too.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=${CT_BUILD:-build}/ctrain
d=$(mktemp -d); trap '[ -n "${KEEP:-}" ] || rm -rf "$d"' EXIT
die() { echo "$*"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_base_warn_component_unused=0
unset WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE CTRAIN_BACKEND
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
for i in $(seq 1 120); do echo "line $i of a text with $((i*7 % 31)) words and $((i*13 % 17)) commas,"; done > "$d/t.txt"
# global batch 12 at every world size: 4 x 3, 3 x 4, 2 x 6, 1 x 12 take the same samples per step
gpt=(gpt --text "$d/t.txt" --n-layer 2 --n-embd 64 --n-head 4 --block-size 96 --steps 20 --log-every 1 --eval-every 0
     --threads 1)
# train NAME BACKEND RANKS ARGS...
train() {
    local name=$1 be=$2 n=$3; shift 3
    if [ "$n" = 1 ]; then
        timeout 300 "$C" train "$@" --batch-size 12 --output-dir "$d/$name" > "$d/$name.log" 2>&1
    elif [ "$be" = mpi ]; then
        CTRAIN_BACKEND=mpi timeout 300 mpirun -np "$n" --oversubscribe "$C" train "$@" --batch-size $((12 / n)) \
            --output-dir "$d/$name" > "$d/$name.log" 2>&1
    else
        CTRAIN_BACKEND=$be timeout 300 "$C" run --nproc-per-node "$n" --standalone "$C" train "$@" --batch-size $((12 / n)) \
            --output-dir "$d/$name" > "$d/$name.log" 2>&1
    fi
}
losses() { grep -o '"train/loss": [0-9.e+-]*' "$1/metrics.jsonl" | cut -d' ' -f2; }
train ref shm 4 "${gpt[@]}" --shard full --save-every 10 || die "ref failed: $(tail -20 "$d/ref.log")"
ck=$d/ref/checkpoints/step-00000010
for f in shards.json train_state.safetensors manifest.json shard-0000{0,1,2,3}-of-00004.safetensors; do
    [ -f "$ck/$f" ] || die "no $f in the sharded checkpoint: $(ls "$ck")"
done
# each shard holds about a quarter of the parameters
whole=$(stat -c %s "$d/ref/model.safetensors"); part=$(stat -c %s "$ck/shard-00001-of-00004.safetensors")
[ "$part" -lt $((whole * 3 / 4 * 3 / 4 + whole / 8)) ] || die "a shard of $part bytes for a model of $whole (with 2 optimizer states)"
report=""
for run in "r3 gloo 3 --shard full" "r2 shm 2 --shard full" "m2 mpi 2 --shard grad-optim" "u1 shm 1"; do
    read -r name be n extra <<<"$run"
    # shellcheck disable=SC2086
    train "$name" "$be" "$n" "${gpt[@]}" $extra --resume "$ck" || die "$name failed: $(tail -20 "$d/$name.log")"
    grep -q "resumed from $ck at step 10" "$d/$name.log" || die "$name did not resume: $(head "$d/$name.log")"
    paste <(losses "$d/ref" | tail -10) <(losses "$d/$name") > "$d/pairs"
    [ "$(wc -l < "$d/pairs")" -eq 10 ] || die "$name: $(wc -l < "$d/pairs") steps after the resume, expected 10"
    m=$(awk '{ x = $1 - $2; if (x < 0) x = -x; if (x > m) m = x } END { printf "%g", m }' "$d/pairs")
    awk -v m="$m" 'BEGIN { exit !(m <= 1e-6) }' || die "$name: losses after the resume differ from the uninterrupted run's by $m"
    report+="resumed at $n rank(s) on $be ${extra:-unsharded}: steps 11-20 within $m of the uninterrupted run"$'\n'
done
# the consolidated export equals the DDP run's checkpoint of the same step, bit for bit
train ddp shm 4 "${gpt[@]}" --save-every 10 || die "ddp failed: $(tail -20 "$d/ddp.log")"
# and that unsharded checkpoint resumes sharded: the same 10 steps as the sharded resumes
train w3 gloo 3 "${gpt[@]}" --shard full --resume "$d/ddp/checkpoints/step-00000010" || die "w3 failed: $(tail -20 "$d/w3.log")"
paste <(losses "$d/ref" | tail -10) <(losses "$d/w3") > "$d/pairs"
m=$(awk '{ x = $1 - $2; if (x < 0) x = -x; if (x > m) m = x } END { printf "%g", m }' "$d/pairs")
[ "$(wc -l < "$d/pairs")" -eq 10 ] && awk -v m="$m" 'BEGIN { exit !(m <= 1e-6) }' || die "w3: losses differ by $m: $(cat "$d/pairs")"
report+="the DDP checkpoint resumed at 3 ranks on gloo --shard full: within $m"$'\n'
"$C" export --checkpoint "$ck" --output "$d/export.safetensors" > "$d/export.log" 2>&1 || die "export: $(cat "$d/export.log")"
cmp -s "$d/export.safetensors" "$d/ddp/checkpoints/step-00000010/model.safetensors" ||
    die "the export of the sharded checkpoint differs from the DDP checkpoint's model.safetensors"
"$C" export --checkpoint "$ck" --hf "$d/hf" > "$d/export_hf.log" 2>&1 || die "export --hf: $(cat "$d/export_hf.log")"
[ -f "$d/hf/config.json" ] && [ -f "$d/hf/model.safetensors" ] || die "export --hf wrote: $(ls "$d/hf")"
"$C" eval --checkpoint "$d/hf" --text "$d/t.txt" > "$d/eval_hf.log" 2>&1 || die "eval of the --hf export: $(cat "$d/eval_hf.log")"
"$C" eval --checkpoint "$ck" --text "$d/t.txt" > "$d/eval.log" 2>&1 || die "eval of the sharded checkpoint: $(cat "$d/eval.log")"
grep -q "perplexity" "$d/eval.log" || die "eval: $(cat "$d/eval.log")"
# the Hugging Face copy holds the same model: the same test loss
l1=$(grep -o "loss [0-9.]*" "$d/eval.log" | head -1); l2=$(grep -o "loss [0-9.]*" "$d/eval_hf.log" | head -1)
[ -n "$l1" ] && [ "$l1" = "$l2" ] || die "eval: sharded checkpoint $l1, its --hf export $l2"
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
    /usr/bin/python3 - "$d/export.safetensors" <<'PYEOF' || die "PyTorch could not load the export"
import sys
sys.path.insert(0, "tests/torch")
import torch, st
from gen_models import GPT
sd, meta = st.load_with_metadata(sys.argv[1])
m = GPT(n_layer=int(meta["ctrain.n_layer"]), n_embd=int(meta["ctrain.n_embd"]), n_head=int(meta["ctrain.n_head"]),
        block_size=int(meta["ctrain.block_size"]), vocab_size=int(meta["ctrain.vocab_size"]))
m.load_state_dict(sd, strict=True)
with torch.no_grad():
    out = m(torch.arange(16).reshape(1, 16))
assert torch.isfinite(out).all()
print("PyTorch: %d tensors loaded with load_state_dict(strict=True)" % len(sd))
PYEOF
else
    echo "(no PyTorch at /usr/bin/python3: the strict load is not checked here; bash scripts/setup-interop.sh installs it)"
fi
# refused before any step, naming the cause
expect_fail() { # NAME PATTERN RANKS ARGS...
    local name=$1 pat=$2 n=$3; shift 3
    train "$name" shm "$n" "$@" && die "$name: ran"
    grep -q "$pat" "$d/$name.log" || die "$name: expected '$pat': $(tail -5 "$d/$name.log")"
    grep -q "^step " "$d/$name.log" && die "$name: trained before refusing"
    return 0
}
expect_fail other "no parameter\|another model\|in the checkpoint" 2 gpt --text "$d/t.txt" --n-layer 1 --n-embd 64 --n-head 4 \
    --block-size 96 --steps 20 --threads 1 --shard full --resume "$ck"
cp -r "$ck" "$d/bad"
printf 'x' | dd of="$d/bad/shard-00002-of-00004.safetensors" bs=1 seek=200 conv=notrunc 2> /dev/null
expect_fail corrupt "shard-00002-of-00004.safetensors: size or checksum differs" 2 "${gpt[@]}" --shard full --resume "$d/bad"
printf '%s' "$report"
echo "export == DDP checkpoint (bits); eval and refusals as expected"
