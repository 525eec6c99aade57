#!/usr/bin/env bash
# Text in and text out with a tokenizer (tests/fixtures/tokenizer/gpt2.json: byte-level BPE,
# vocabulary 3000, <|endoftext|> = 0):
# - ctrain tokenize writes the `tokenizers` package's ids for the fixture text into a shard,
#   after <|endoftext|>, and splits into shards of --shard-tokens;
# - train gpt --text --tokenizer trains, keeps the tokenizer in OUTPUT/ (and OUTPUT/hf/, with a
#   tokenizer directory's tokenizer_config.json and special_tokens_map.json);
# - generate --prompt "text" prints text through it; eval --text reports perplexity on text,
#   the same as eval on the shard of the same text;
# - a llama trains through Llama 3's tokenizer, whose documents open with its BOS;
# - errors: a tokenizer larger than the model's vocabulary, --text without --tokenizer for a
#   vocabulary other than 256, a malformed tokenizer.json: one line, exit non-zero.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/scripts/lib/cli_expect.sh
F=tests/fixtures/tokenizer

# 1. tokenize: the shard holds <|endoftext|> (0) then the package's ids (gpt2.ids: int32)
$C tokenize --tokenizer "$F/gpt2.json" --output "$d/fix" "$F/text.txt" > "$d/tok.out" 2> "$d/tok.err" || fail "tokenize: $(cat "$d/tok.err")"
grep -q "tokenize: 1/1 files" "$d/tok.err" || fail "no progress line: $(cat "$d/tok.err")"
grep -q "version 1, vocabulary 3000" "$d/tok.out" || fail "summary: $(cat "$d/tok.out")"
n=$(( $(stat -c %s "$F/gpt2.ids") / 4 ))
{ perl -e 'print pack("l<256", 20240520, 1, '$((n + 1))', (0) x 253), pack("S<", 0)'
  perl -e 'local $/; my $b = <STDIN>; print pack("S<*", unpack("l<*", $b))' < "$F/gpt2.ids"; } > "$d/want.bin"
cmp -s "$d/fix_000000.bin" "$d/want.bin" || fail "the shard differs from <|endoftext|> + gpt2.ids"
# the directory form, several files, small shards: the same tokens, split
cp "$F/gpt2.json" "$d/tokenizer.json"
head -c 20000 "$F/text.txt" > "$d/a.txt"; tail -c 20000 "$F/text.txt" > "$d/b.txt"
$C tokenize --tokenizer "$d" --output "$d/two" --shard-tokens 4000 --quiet "$d/a.txt" "$d/b.txt" > "$d/tok.out" 2> "$d/tok.err" ||
    fail "tokenize a directory's tokenizer: $(cat "$d/tok.err")"
[ ! -s "$d/tok.err" ] || fail "--quiet printed: $(cat "$d/tok.err")"
[ -s "$d/two_000000.bin" ] && [ -s "$d/two_000001.bin" ] || fail "no second shard: $(ls "$d")"
# the two shards hold a.txt's document then b.txt's, as one file each gives them
toks() { perl -e 'for my $f (@ARGV) { open my $h, "<", $f; binmode $h; local $/; my $b = <$h>; my @h = unpack("l<3", $b);
    my @t = unpack("S<*", substr($b, 1024)); die "$f: count\n" unless @t == $h[2]; print join(",", @t), "\n" }' "$@" | paste -sd, -; }
$C tokenize --tokenizer "$d" --output "$d/a" --quiet "$d/a.txt" > /dev/null && $C tokenize --tokenizer "$d" --output "$d/b" --quiet "$d/b.txt" > /dev/null ||
    fail "tokenize a.txt, b.txt"
[ "$(toks "$d"/two_*.bin)" = "$(toks "$d/a_000000.bin" "$d/b_000000.bin")" ] || fail "split shards differ from the documents' tokens"
[ "$(toks "$d/a_000000.bin" | cut -d, -f1)" = 0 ] || fail "a document does not start with <|endoftext|>"

# 2. train a tiny gpt on the text through the tokenizer
for i in $(seq 1 80); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7 % 13)) times."; done > "$d/t.txt"
g=(gpt --text "$d/t.txt" --tokenizer "$F/gpt2.json" --vocab-size 3000 --n-layer 1 --n-embd 32 --n-head 2 --block-size 16 --batch-size 8
   --steps 6 --log-every 100)
$C train "${g[@]}" "${q[@]}" --export hf --output-dir "$d/g" > "$d/train.log" 2>&1 || fail "train: $(tail -3 "$d/train.log")"
grep -q "tokenized with $F/gpt2.json (vocabulary 3000)" "$d/train.log" || fail "no tokenizer line: $(head -3 "$d/train.log")"
cmp -s "$d/g/tokenizer.json" "$F/gpt2.json" && cmp -s "$d/g/hf/tokenizer.json" "$F/gpt2.json" || fail "the output keeps no tokenizer: $(ls "$d/g")"
# a tokenizer directory's tokenizer_config.json / special_tokens_map.json go to the export beside tokenizer.json
echo '{"tokenizer_class": "GPT2TokenizerFast", "eos_token": "<|endoftext|>"}' > "$d/tokenizer_config.json"
echo '{"eos_token": "<|endoftext|>"}' > "$d/special_tokens_map.json"
$C train gpt --text "$d/t.txt" --tokenizer "$d" --vocab-size 3000 --n-layer 1 --n-embd 32 --n-head 2 --block-size 16 --batch-size 8 \
    --steps 1 --log-every 100 "${q[@]}" --export hf --output-dir "$d/gt" > "$d/train_t.log" 2>&1 || fail "train: $(tail -3 "$d/train_t.log")"
for f in tokenizer.json tokenizer_config.json special_tokens_map.json; do
    cmp -s "$d/gt/hf/$f" "$d/$f" || fail "the export lacks the tokenizer's $f: $(ls "$d/gt/hf")"
done
rm "$d/tokenizer_config.json" "$d/special_tokens_map.json"
tl=$(sed -nE 's/^done: .*test accuracy ([0-9.]+) \| test loss ([0-9.]+).*/\2 \1/p' "$d/train.log")
[ -n "$tl" ] || fail "no final evaluation in: $(tail -2 "$d/train.log")"

# 3. generate: text in, text out (the prompt, then the decoded continuation)
out=$($C generate --checkpoint "$d/g" --prompt "line 3: the" --max-new-tokens 12 --seed 4 "${q[@]}" 2>"$d/gen.err") || fail "generate: $(cat "$d/gen.err")"
[ "${out:0:11}" = "line 3: the" ] || fail "generate should print the prompt first: '$out'"
echo "$out" | grep -qE '^[0-9]+(,[0-9]+)+$' && fail "generate printed ids: '$out'"
grep -qE "^12 tokens in" "$d/gen.err" || fail "no tokens/s line: $(cat "$d/gen.err")"
# from the checkpoint directory (the tokenizer two levels up), the export, and --tokenizer: the same text
for src in "$d/g/checkpoints" "$d/g/hf"; do
    o=$($C generate --checkpoint "$src" --prompt "line 3: the" --max-new-tokens 12 --seed 4 "${q[@]}" 2>/dev/null) || fail "generate $src"
    [ "$o" = "$out" ] || fail "generate from $src: '$o', from $d/g: '$out'"
done
o=$($C generate --checkpoint "$d/g/model.safetensors" --tokenizer "$d" --prompt "line 3: the" --max-new-tokens 12 --seed 4 "${q[@]}" 2>/dev/null)
[ "$o" = "$out" ] || fail "generate --tokenizer: '$o' vs '$out'"

# 4. eval on text = the trainer's final evaluation; on the shard of the same text, the same
el=$($C eval --checkpoint "$d/g" --text "$d/t.txt" "${q[@]}" | sed -nE 's/^test split: [0-9]+ tokens \| loss ([0-9.]+) \| perplexity [0-9.]+ \| next-token accuracy ([0-9.]+).*/\1 \2/p')
[ "$el" = "$tl" ] || fail "eval --text: '$el', the trainer said '$tl'"
$C tokenize --tokenizer "$d/g" --output "$d/t" --quiet "$d/t.txt" > /dev/null || fail "tokenize t.txt"
es=$($C eval --checkpoint "$d/g" --shards "$d/t_000000.bin" "${q[@]}" | sed -nE 's/^test split: [0-9]+ tokens \| loss ([0-9.]+) \| perplexity [0-9.]+ \| next-token accuracy ([0-9.]+).*/\1 \2/p')
[ "$es" = "$tl" ] || fail "eval on the shard: '$es', on the text '$tl'"

# a llama through Llama 3's tokenizer (BOS <|begin_of_text|> opens the document): eval on text = the trainer's
l=(llama --text "$d/t.txt" --tokenizer "$F/llama3.json" --vocab-size 3000 --num-hidden-layers 1 --hidden-size 32 --intermediate-size 64
   --num-attention-heads 2 --num-key-value-heads 1 --max-position-embeddings 16 --batch-size 8 --steps 3 --log-every 100)
$C train "${l[@]}" "${q[@]}" --output-dir "$d/l" > "$d/ltrain.log" 2>&1 || fail "train llama: $(tail -3 "$d/ltrain.log")"
tl=$(sed -nE 's/^done: .*test accuracy ([0-9.]+) \| test loss ([0-9.]+).*/\2 \1/p' "$d/ltrain.log")
el=$($C eval --checkpoint "$d/l" --text "$d/t.txt" "${q[@]}" | sed -nE 's/^test split: [0-9]+ tokens \| loss ([0-9.]+) \| perplexity [0-9.]+ \| next-token accuracy ([0-9.]+).*/\1 \2/p')
[ -n "$tl" ] && [ "$el" = "$tl" ] || fail "llama: eval --text '$el', the trainer said '$tl'"
$C tokenize --tokenizer "$d/l" --output "$d/lt" --quiet "$d/t.txt" > /dev/null || fail "tokenize with llama3.json"
[ "$(toks "$d/lt_000000.bin" | cut -d, -f1)" = 1 ] || fail "a Llama 3 document does not start with <|begin_of_text|>"

# 5. errors: one line, exit non-zero
expect "tokenizer .*gpt2.json has 3000 tokens, more than the vocabulary of the gpt \(--vocab-size\) \(256\)" \
    $C train gpt --text "$d/t.txt" --tokenizer "$F/gpt2.json" --block-size 16 --steps 1 "${q[@]}" --output-dir "$d/x"
expect "--text without --tokenizer trains on bytes \(vocabulary 256\), but the gpt's vocabulary is 3000" \
    $C train gpt --text "$d/t.txt" --vocab-size 3000 --block-size 16 --steps 1 "${q[@]}" --output-dir "$d/x"
expect "--tokenizer expects --text" $C train gpt --shards "$d/t_000000.bin" --tokenizer "$F/gpt2.json" --output-dir "$d/x"
printf '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [' > "$d/bad.json"
expect "bad.json" $C tokenize --tokenizer "$d/bad.json" --output "$d/bad" "$d/t.txt"
expect "bad.json" $C train "${g[@]}" --tokenizer "$d/bad.json" "${q[@]}" --output-dir "$d/x"
expect "bad.json" $C generate --checkpoint "$d/g" --tokenizer "$d/bad.json" --prompt hi "${q[@]}"
expect "bad.json" $C eval --checkpoint "$d/g" --tokenizer "$d/bad.json" --text "$d/t.txt" "${q[@]}"
expect "no tokenizer.json" $C tokenize --tokenizer "$d/g/checkpoints" --output "$d/bad" "$d/t.txt"
expect "no-such.txt" $C tokenize --tokenizer "$F/gpt2.json" --output "$d/bad" "$d/no-such.txt"
exit 0
