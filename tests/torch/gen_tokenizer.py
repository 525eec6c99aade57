#!/usr/bin/env python3
"""Makes the tokenizer fixtures (tests/fixtures/tokenizer/) with the `tokenizers` package:
two byte-level BPE tokenizers trained on license texts Debian ships, one with GPT-2's
pre-tokenizer and one with Llama 3's split pattern (ignore_merges, a BOS template), both
with a special and an added token; a varied text (scripts, emoji, CJK, combining marks,
runs of digits and whitespace, contractions, special tokens inline); and the ids the
package's encode gives for it (int32 little-endian). tests/unit/test_tokenizer.c checks
ctrain's encoder against them token for token.

Usage: python3 -m venv build/venv-tok && build/venv-tok/bin/pip install tokenizers
       build/venv-tok/bin/python tests/torch/gen_tokenizer.py [outdir]
"""
import glob
import os
import random
import struct
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

OUT = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/tokenizer"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")

rng = random.Random(1234)
BLOCKS = [(0x41, 0x7A), (0xC0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x591, 0x5F4), (0x600, 0x6FF),
          (0x900, 0x97F), (0xE00, 0xE5B), (0x1100, 0x11FF), (0x3040, 0x30FF), (0x4E00, 0x4FFF),
          (0xAC00, 0xAD00), (0x1F300, 0x1F64F), (0x1F900, 0x1F9FF), (0x2000, 0x206F), (0x2150, 0x218B),
          (0xFF01, 0xFF5E), (0x10400, 0x1044F), (0x1D400, 0x1D4FF), (0x20000, 0x200FF)]
PIECES = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'ſ", "n't", "I'm", "we'll", "'x",
          " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2009", "\u0085",
          "12345678", "3.14159", "٣٤٥٦", "１２３", "Ⅻ", "²³", "e\u0301", "a\u0308\u0304", "👩\u200d💻", "🇩🇪",
          "<|endoftext|>", " <|endoftext|>", "<|begin_of_text|>", "ctrain", " ctrain", "--", "...", "\u200b",
          "\U0001F600", "é", "\x00", "\x1f", "\x7f", "ß", "İ", "ǅ"]


def varied(n_words):
    out = []
    for _ in range(n_words):
        r = rng.random()
        if r < 0.35:
            out.append(rng.choice(PIECES))
        elif r < 0.7:
            lo, hi = rng.choice(BLOCKS)
            out.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8))))
        else:
            out.append(rng.choice(["the", "The", "licence", "Software", "GNU", "free", "x", "of", "copy"]))
        out.append(rng.choice(["", " ", " ", " ", "  ", "\n", ", ", "\t"]))
    s = "".join(out)
    # characters the package's regex engine and the UCD this build reads agree on: nothing
    # unassigned, no surrogates
    import unicodedata
    return "".join(c for c in s if unicodedata.category(c) != "Cn" or c in "\x00")


def licenses():
    text = []
    for p in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(p):
            text.append(open(p, encoding="utf-8", errors="replace").read())
    return text


def train(pretok, ignore_merges, corpus):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pretok
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, special_tokens=["<|endoftext|>", "<|begin_of_text|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, tr)
    tok.add_tokens([AddedToken("ctrain", normalized=False)])
    return tok


def main():
    os.makedirs(OUT, exist_ok=True)
    lic = licenses()
    corpus = lic + [varied(3000) for _ in range(4)]
    text = varied(14000) + "\n" + lic[0][:20000] + "   \n\n" + varied(2000) + " 'll  "
    gpt2 = train(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), False, corpus)
    llama = train(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
                                           pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
                  True, corpus)
    llama.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", llama.token_to_id("<|begin_of_text|>"))])
    with open(os.path.join(OUT, "text.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(text)
    for name, tok in (("gpt2", gpt2), ("llama3", llama)):
        tok.save(os.path.join(OUT, name + ".json"), pretty=False)
        ids = tok.encode(text, add_special_tokens=False).ids
        with open(os.path.join(OUT, name + ".ids"), "wb") as f:
            f.write(struct.pack(f"<{len(ids)}i", *ids))
        print(f"{name}: {len(text.encode())} bytes of text, {len(ids)} ids, vocab {tok.get_vocab_size()}")


main()
