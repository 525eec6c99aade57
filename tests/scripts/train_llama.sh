#!/usr/bin/env bash
# `ctrain train llama` on a small text: a few steps with grouped-query heads, the file alone
# says what it is (its metadata), and `ctrain eval` of it gives the training run's test loss.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${CT_BUILD:-build}
[ -x "$B/ctrain" ] || { echo "$B/ctrain missing: build first"; exit 1; }
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
head -c 20000 README.md > "$d/t.txt"
$B/ctrain train llama --text "$d/t.txt" --steps 5 --num-hidden-layers 2 --hidden-size 64 --num-attention-heads 4 \
    --num-key-value-heads 2 --intermediate-size 176 --threads 2 --output-dir "$d/run" > "$d/train.log" 2>&1 ||
    { cat "$d/train.log"; fail "ctrain train llama"; }
grep -q 'Llama(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2' "$d/train.log" ||
    { cat "$d/train.log"; fail "the log does not describe the Llama"; }
hdr=$(head -c 8192 "$d/run/model.safetensors" | tail -c +9 | tr -d '\0')
for want in '"ctrain.model":"llama"' '"ctrain.num_key_value_heads":"2"' '"model.layers.1.self_attn.k_proj.weight":{"dtype":"F32","shape":[32,64]'; do
    [[ "$hdr" == *"$want"* ]] || fail "model.safetensors lacks $want"
done
tl=$(sed -n 's/^done: .*test loss \([0-9.]*\).*/\1/p' "$d/train.log")
el=$($B/ctrain eval --checkpoint "$d/run" --text "$d/t.txt" --threads 2 | sed -n 's/^test split: .* loss \([0-9.]*\) .*/\1/p')
[ -n "$tl" ] && [ "$tl" = "$el" ] || fail "eval's test loss '$el' is not training's '$tl'"
echo "llama: trained 5 steps, saved, evaluated (test loss $el)"

# --amp bf16 (RMSNorm in f32 as LlamaRMSNorm; silu, rope, repeat_kv on bf16) follows the f32
# run: each of 10 steps' training loss within 1e-2 of f32's
a=(llama --text "$d/t.txt" --steps 10 --num-hidden-layers 2 --hidden-size 64 --num-attention-heads 4
   --num-key-value-heads 2 --intermediate-size 176 --threads 2 --log-every 1 --eval-every 1000 --seed 3)
for m in f32 bf16; do
    amp=(); [ $m = bf16 ] && amp=(--amp bf16)
    $B/ctrain train "${a[@]}" "${amp[@]}" --output-dir "$d/$m" > "$d/$m.log" 2>&1 || { tail -5 "$d/$m.log"; fail "$m run"; }
done
grep -q 'autocast bf16' "$d/bf16.log" || fail "the bf16 run does not say it autocasts"
losses() { sed -n 's/^step *[0-9]*\/10 .*| loss \([0-9.]*\) .*/\1/p' "$d/$1.log"; }
dmax=$(paste <(losses f32) <(losses bf16) | awk 'NF == 2 { n++; d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d }
    END { if (n != 10) exit 1; printf "%.4f", m }') || fail "not 10 step losses in both logs"
awk -v m="$dmax" 'BEGIN { exit !(m <= 0.01) }' || fail "bf16 step loss up to $dmax from f32's (over 1e-2)"
echo "llama --amp bf16: 10 step losses within $dmax of f32"

# DDP: 2 ranks × batch 16 with the sharded optimizer step (ct_zero) and without it give the
# same bits; 1 rank × batch 32 the same test loss (within rounding: the averaged gradient's sums
# are ordered differently)
a=(llama --text "$d/t.txt" --steps 6 --num-hidden-layers 2 --hidden-size 64 --num-attention-heads 4
   --num-key-value-heads 2 --intermediate-size 176 --threads 1 --eval-every 1000 --seed 3)
R=(run --nproc-per-node 2 --standalone)
$B/ctrain "${R[@]}" $B/ctrain train "${a[@]}" --batch-size 16 --output-dir "$d/m" > "$d/m.log" 2>&1 || { cat "$d/m.log"; fail "2-rank run"; }
grep -q "^ddp: sharded optimizer step" "$d/m.log" || { cat "$d/m.log"; fail "2-rank run not sharded"; }
CTRAIN_DDP_SHARD_OPTIM=0 $B/ctrain "${R[@]}" $B/ctrain train "${a[@]}" --batch-size 16 --output-dir "$d/u" > "$d/u.log" 2>&1 ||
    { cat "$d/u.log"; fail "2-rank run, CTRAIN_DDP_SHARD_OPTIM=0"; }
grep -q "^ddp: [0-9]* buckets" "$d/u.log" || { cat "$d/u.log"; fail "CTRAIN_DDP_SHARD_OPTIM=0 still sharded"; }
cmp "$d/m/model.safetensors" "$d/u/model.safetensors" || fail "sharded and unsharded 2-rank Llama runs differ"
$B/ctrain train "${a[@]}" --batch-size 32 --output-dir "$d/one" > "$d/one.log" 2>&1 || { cat "$d/one.log"; fail "1-rank run"; }
tl() { sed -n 's/^done: .*test loss \([0-9.]*\).*/\1/p' "$d/$1.log"; }
l1=$(tl one); l2=$(tl m)
awk -v a="$l1" -v b="$l2" 'BEGIN { d = a - b; exit !(a != "" && b != "" && d <= 1e-3 && d >= -1e-3) }' ||
    fail "2-rank test loss '$l2' is not 1-rank's '$l1'"
echo "llama DDP: sharded = unsharded 2-rank weights (cmp); test loss 2 ranks $l2, 1 rank $l1"
