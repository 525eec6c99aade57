#!/usr/bin/env bash
# ctrain eval and ctrain generate, and GPT-2 weights in and out (train --init-from, --export hf):
# - the tiny transformers GPT-2 (tests/fixtures/models/gpt2_hf) continues its prompt greedily with
#   transformers' tokens, with and without the KV cache, from the file and from the directory;
# - a trained GPT: eval gives the trainer's final test loss and accuracy, its Hugging Face export
#   generates the same tokens and has the same loss; sampling is seeded; cache or not, same tokens;
# - --init-from the fixture trains; bad input gets one line and a non-zero exit.
# When a Python with transformers is at hand ($PYTHON, default python3), transformers also loads
# the export and must give ctrain's logits (tests/torch/gen_gpt2_hf.py check); CI's PyTorch-side
# interop tests cover that otherwise.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/scripts/lib/cli_expect.sh
F=tests/fixtures/models/gpt2_hf

# 1. transformers' greedy continuation of "Hello, GPT" (expected.safetensors: prompt, greedy)
want=99,135,107,175,175,175,175,175,175,175,224,225,200,175,78,44,135,200,72,77,135,135,229,128
prompt=72,101,108,108,111,44,32,71,80,84
for src in "$F" "$F/model.safetensors"; do
    for kv in "" --no-kv-cache; do
        got=$($C generate --checkpoint "$src" --prompt-tokens $prompt --temperature 0 --max-new-tokens 24 $kv "${q[@]}" 2>"$d/err") ||
            fail "generate $src $kv: $(cat "$d/err")"
        [ "$got" = "$want" ] || fail "greedy from $src $kv: $got, transformers gives $want"
        grep -qE "^24 tokens in .* tokens/s" "$d/err" || fail "no tokens/s line: $(cat "$d/err")"
    done
done

# 2. a trained byte-level GPT
for i in $(seq 1 60); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7 % 13)) times."; done > "$d/t.txt"
g=(gpt --text "$d/t.txt" --n-layer 2 --n-embd 32 --n-head 2 --block-size 32 --batch-size 8 --steps 20 --log-every 100)
$C train "${g[@]}" "${q[@]}" --export hf --output-dir "$d/g" > "$d/train.log" 2>&1 || fail "train: $(tail -3 "$d/train.log")"
grep -q "exported for transformers: $d/g/hf/" "$d/train.log" || fail "no export line: $(tail -3 "$d/train.log")"
[ -s "$d/g/hf/model.safetensors" ] && grep -qE '"model_type":\s*"gpt2"' "$d/g/hf/config.json" || fail "export files"
grep -qE '"activation_function":\s*"gelu"' "$d/g/hf/config.json" || fail "ctrain's exact GELU must be exported as gelu"
# eval = the trainer's final evaluation (same held-out windows)
tl=$(sed -nE 's/^done: .*test accuracy ([0-9.]+) \| test loss ([0-9.]+).*/\2 \1/p' "$d/train.log")
[ -n "$tl" ] || fail "no final evaluation in: $(tail -2 "$d/train.log")"
for src in "$d/g" "$d/g/hf" "$d/g/checkpoints"; do
    out=$($C eval --checkpoint "$src" --text "$d/t.txt" "${q[@]}") || fail "eval $src"
    el=$(echo "$out" | sed -nE 's/^test split: [0-9]+ tokens \| loss ([0-9.]+) \| perplexity [0-9.]+ \| next-token accuracy ([0-9.]+).*/\1 \2/p')
    [ "$el" = "$tl" ] || fail "eval of $src: '$el', the trainer said '$tl': $out"
done
# --device: cpu is the default; auto without a GPU runs on the CPU; a GPU that is not there
# (or a misspelt device) is a flag error. On a GPU: eval of the model on cuda (same loss and
# accuracy within rounding) is in scripts/gpu-check.sh's cli step.
el=$($C eval --checkpoint "$d/g" --text "$d/t.txt" --device cpu "${q[@]}" |
     sed -nE 's/^test split: [0-9]+ tokens \| loss ([0-9.]+) \| perplexity [0-9.]+ \| next-token accuracy ([0-9.]+).*/\1 \2/p')
[ "$el" = "$tl" ] || fail "eval --device cpu: '$el', the trainer said '$tl'"
expect "--device expects cpu, cuda, cuda:N or auto, got .gpu7." $C eval --checkpoint "$d/g" --text "$d/t.txt" --device gpu7
if $C env 2>/dev/null | grep -qE "^cuda: .*(no GPU|not built)"; then
    el=$($C eval --checkpoint "$d/g" --text "$d/t.txt" --device auto "${q[@]}" |
         sed -nE 's/^test split: [0-9]+ tokens \| loss ([0-9.]+) \| perplexity [0-9.]+ \| next-token accuracy ([0-9.]+).*/\1 \2/p')
    [ "$el" = "$tl" ] || fail "eval --device auto without a GPU: '$el', the trainer said '$tl'"
    expect "ctrain eval: --device cuda:0: no CUDA GPU usable here" $C eval --checkpoint "$d/g" --text "$d/t.txt" --device cuda:0
fi
# generation: seeded, the same with or without the cache, the same from the export
gen() { $C generate --checkpoint "$1" --prompt "line 1" --max-new-tokens 40 --temperature 0.8 --top-k 10 "${@:2}" "${q[@]}" 2>/dev/null; }
a=$(gen "$d/g" --seed 5) && b=$(gen "$d/g" --seed 5 --no-kv-cache) && h=$(gen "$d/g/hf" --seed 5) && o=$(gen "$d/g" --seed 6) ||
    fail "generate from the trained model"
[ "$a" = "$b" ] || fail "KV cache changed the tokens: '$a' vs '$b'"
[ "$a" = "$h" ] || fail "the Hugging Face export generates otherwise: '$a' vs '$h'"
[ "$a" != "$o" ] || fail "seeds 5 and 6 gave the same text: '$a'"
[ "${a:0:6}" = "line 1" ] && [ ${#a} -eq 46 ] || fail "expected the prompt and 40 bytes, got '$a'"
# past the context (32): both paths crop the same way
a=$($C generate --checkpoint "$d/g" --prompt "line 2: the quick brown fox jumps" --max-new-tokens 50 --temperature 0 "${q[@]}" 2>/dev/null)
b=$($C generate --checkpoint "$d/g" --prompt "line 2: the quick brown fox jumps" --max-new-tokens 50 --temperature 0 --no-kv-cache "${q[@]}" 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] || fail "past block_size, cache and no cache differ: '$a' vs '$b'"
# transformers on the export gives ctrain's logits (where transformers is installed)
PY=${PYTHON:-python3}
$C generate --checkpoint "$d/g" --prompt "line 3: the lazy dog" --max-new-tokens 0 --logits "$d/ref.safetensors" "${q[@]}" >/dev/null 2>&1 ||
    fail "--logits"
if $PY -c "import transformers, torch" 2>/dev/null; then
    $PY tests/torch/gen_gpt2_hf.py check "$d/g/hf" "$d/ref.safetensors" 2>/dev/null | grep -q "^ok" || fail "transformers' logits differ from ctrain's"
fi

# a token-id model (llm.c shard, vocabulary 300): eval = the trainer's, --prompt-tokens, no --prompt
perl -e 'my @t = map { ($_ * 37 + int($_ / 7)) % 300 } 0 .. 3999; print pack("l<256", 20240520, 1, scalar(@t), (0) x 253), pack("S<*", @t)' \
    > "$d/s.bin"
$C train gpt --shards "$d/s.bin" --vocab-size 300 --n-layer 1 --n-embd 32 --n-head 2 --block-size 16 --batch-size 8 --steps 10 \
    --log-every 100 "${q[@]}" --output-dir "$d/s" > "$d/shard.log" 2>&1 || fail "train on shards: $(tail -3 "$d/shard.log")"
tl=$(sed -nE 's/^done: .*test accuracy ([0-9.]+) \| test loss ([0-9.]+).*/\2 \1/p' "$d/shard.log")
el=$($C eval --checkpoint "$d/s" --shards "$d/s.bin" "${q[@]}" | sed -nE 's/^test split: .* loss ([0-9.]+) \| perplexity [0-9.]+ \| next-token accuracy ([0-9.]+).*/\1 \2/p')
[ -n "$tl" ] && [ "$el" = "$tl" ] || fail "eval on shards: '$el', the trainer said '$tl'"
ids=$($C generate --checkpoint "$d/s" --prompt-tokens 5,299,17 --max-new-tokens 12 --seed 3 "${q[@]}" 2>/dev/null)
echo "$ids" | grep -qE '^[0-9]+(,[0-9]+){11}$' || fail "--prompt-tokens output: '$ids'"
for t in ${ids//,/ }; do [ "$t" -lt 300 ] || fail "token $t outside the vocabulary"; done
expect "vocabulary has 300 tokens, not 256 bytes.*give --tokenizer" $C generate --checkpoint "$d/s" --prompt hi

# an image model: eval = the trainer's final test loss and accuracy (where Fashion-MNIST is installed)
if [ -r /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ]; then
    $C train mlp --hidden 32 --steps 20 --batch-size 50 "${q[@]}" --log-every 100 --output-dir "$d/m" > "$d/mlp.log" 2>&1 ||
        fail "train mlp: $(tail -3 "$d/mlp.log")"
    tl=$(sed -nE 's/^done: .*test accuracy ([0-9.]+) \| test loss ([0-9.]+).*/\2 \1/p' "$d/mlp.log")
    out=$($C eval --checkpoint "$d/m" --batch-size 50 "${q[@]}") || fail "eval mlp"
    el=$(echo "$out" | sed -nE 's/^test split: 10000 samples \| loss ([0-9.]+) \| accuracy ([0-9.]+).*/\1 \2/p')
    [ -n "$tl" ] && [ "$el" = "$tl" ] || fail "eval of the mlp: '$el', the trainer said '$tl': $out"
    expect "--text and --shards are for a gpt" $C eval --checkpoint "$d/m" --text "$d/t.txt"
    expect "holds a mlp: generate needs a gpt" $C generate --checkpoint "$d/m" --prompt hi
fi

# 3. --init-from the transformers GPT-2: its shape (and tanh GELU) replace the flags
$C train gpt --init-from "$F/model.safetensors" --text "$d/t.txt" --block-size 16 --batch-size 4 --steps 3 --log-every 100 \
    "${q[@]}" --output-dir "$d/i" > "$d/init.log" 2>&1 || fail "init-from: $(tail -3 "$d/init.log")"
grep -q "initialised from $F/model.safetensors: GPT(n_layer=2, n_embd=64, n_head=4, block_size=64, vocab_size=256, dropout=0, gelu=tanh)" \
    "$d/init.log" || fail "init-from line: $(head -3 "$d/init.log")"
$C eval --checkpoint "$d/i" --text "$d/t.txt" "${q[@]}" | grep -q "gelu=tanh" || fail "the tanh GELU is lost on save"

# 4. bad input: one line, non-zero exit
expect "--checkpoint $d/none: No such file" $C eval --checkpoint "$d/none" --text "$d/t.txt"
expect "--checkpoint $d/none: No such file" $C generate --checkpoint "$d/none" --prompt hi
expect "no model.safetensors in it and no valid checkpoint" $C generate --checkpoint "$d" --prompt hi
expect "model_mlp.weights.safetensors: no ctrain model metadata" $C generate --checkpoint tests/fixtures/models/model_mlp.weights.safetensors --prompt hi
printf 'not safetensors at all' > "$d/bad.safetensors"
expect "bad.safetensors" $C eval --checkpoint "$d/bad.safetensors" --text "$d/t.txt"
expect "--prompt expects at least one character" $C generate --checkpoint "$F" --prompt ""
expect "--prompt-tokens expects comma-separated token ids" $C generate --checkpoint "$F" --prompt-tokens 1,,2
expect "prompt token 300 at position 1 is outside the vocabulary" $C generate --checkpoint "$F" --prompt-tokens 1,300
expect "--temperature expects a number in \[0, 100\], got '-1'" $C generate --checkpoint "$F" --prompt hi --temperature -1
expect "--max-new-tokens expects an integer" $C generate --checkpoint "$F" --prompt hi --max-new-tokens 1e3
expect "--top-k expects an integer" $C generate --checkpoint "$F" --prompt hi --top-k x
expect "unknown option '--bogus'" $C generate --checkpoint "$F" --prompt hi --bogus
expect "a gpt needs --text FILE or --shards GLOB" $C eval --checkpoint "$F"
expect "--block-size 100 is longer than the model's context \(64\)" $C eval --checkpoint "$F" --text "$d/t.txt" --block-size 100
expect "--block-size 100 is longer than the context of the model" $C train gpt --init-from "$F/model.safetensors" --text "$d/t.txt" \
    --block-size 100 --output-dir "$d/o"
expect "holds a gpt, not a mlp" $C train mlp --init-from "$F/model.safetensors" --output-dir "$d/o"
expect "--export expects a model with a Hugging Face layout: gpt" $C train mlp --export hf
expect "--export expects hf" $C train gpt --text "$d/t.txt" --export onnx
echo "ok: greedy = transformers', eval = the trainer's evaluation, export generates alike, seeded sampling, bad input refused"
