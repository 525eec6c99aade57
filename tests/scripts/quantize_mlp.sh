#!/usr/bin/env bash
# `ctrain quantize`: an MLP trained briefly on Fashion-MNIST keeps its test accuracy within
# 0.3 points once every Linear is int8 (per tensor and per channel), the file holds I8
# weights with F32 scales, I64 zero points and the dynamic-quantization metadata, and bad
# invocations fail with one line.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=build/ctrain
data=${CTRAIN_DATA_DIR:-/usr/share/datasets/fashion-mnist}
if [ ! -r "$data/t10k-images-idx3-ubyte.gz" ] && [ ! -r "$data/t10k-images-idx3-ubyte" ]; then
    echo "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"; exit 77
fi
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
$C train mlp --hidden 256,128 --steps 300 --batch-size 64 --eval-max 1000 --threads 1 --log-every 100 --data-dir "$data" \
    --output-dir "$d/run" > "$d/train.log" 2>&1 || { cat "$d/train.log"; exit 1; }
ck=$(ls -d "$d"/run/checkpoints/step-* | tail -1)
for mode in "" --per-channel; do
    $C quantize --checkpoint "$ck" --model mlp --hidden 256,128 --output "$d/q.safetensors" $mode --eval-data "$data" \
        --threads 1 > "$d/q.log" 2>&1 || { cat "$d/q.log"; exit 1; }
    f32=$(awk '$1 == "f32" && $2 ~ /%$/ { sub("%", "", $2); print $2 }' "$d/q.log")
    i8=$(awk '$1 == "int8" && $2 ~ /%$/ { sub("%", "", $2); print $2 }' "$d/q.log")
    [ -n "$f32" ] && [ -n "$i8" ] || { cat "$d/q.log"; echo "no accuracy lines"; exit 1; }
    awk -v a="$f32" -v b="$i8" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.3 && a > 70) }' ||
        { cat "$d/q.log"; echo "int8 accuracy $i8% vs f32 $f32%: more than 0.3 points apart (or f32 untrained)"; exit 1; }
    echo "${mode:-per-tensor}: f32 $f32%, int8 $i8%"
    # the header (JSON after 8 bytes of length) names the layout
    hdr=$(head -c 4096 "$d/q.safetensors" | tail -c +9 | tr -d '\0')
    for want in '"0.weight":{"dtype":"I8","shape":[256,784]' '"0.weight_scale":{"dtype":"F32"' '"0.weight_zero_point":{"dtype":"I64"' \
                '"4.bias":{"dtype":"F32","shape":[10]' '"quantization":"dynamic"' '"dtype":"qint8"'; do
        [[ "$hdr" == *"$want"* ]] || { echo "header lacks $want: $hdr"; exit 1; }
    done
done
[[ "$hdr" == *'"qscheme":"per_channel_symmetric"'* ]] || { echo "per-channel file says otherwise: $hdr"; exit 1; }
grep -q '0.weight_scale":{"dtype":"F32","shape":\[256\]' <<<"$hdr" || { echo "per-channel scales not [256]"; exit 1; }
# wrong shape flags: one line naming the tensor, exit 1
if $C quantize --checkpoint "$ck" --model mlp --hidden 64 --output "$d/x.safetensors" > "$d/bad.log" 2>&1; then
    echo "wrong --hidden accepted"; exit 1
fi
grep -q "ctrain quantize: .*0.weight" "$d/bad.log" || { cat "$d/bad.log"; exit 1; }
if $C quantize --checkpoint "$ck" --model gpt --output "$d/x.safetensors" --eval-data "$data" > "$d/bad.log" 2>&1; then
    echo "gpt --eval-data accepted"; exit 1
fi
[ ! -e "$d/x.safetensors" ] || { echo "a failed run left its output"; exit 1; }
echo "quantized MLP within 0.3 points of f32, file layout checked"
