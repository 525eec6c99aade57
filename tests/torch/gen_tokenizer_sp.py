#!/usr/bin/env python3
"""Makes two more tokenizer fixtures (tests/fixtures/tokenizer/) with the `tokenizers` package,
trained on the license texts Debian ships plus generated text (tokenizer_text.py):

- sp.json: SentencePiece-style BPE as Llama 2's and TinyLlama's tokenizer.json have it:
  normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, BPE over characters with
  byte_fallback (<0x00>..<0xFF> in the vocabulary, ids 3-258) and fuse_unk, <unk> <s> </s>,
  a BOS template, decoder Replace/ByteFallback/Fuse/Strip. The alphabet is limited, so rare
  characters fall back to bytes.
- qwen2.json: byte-level BPE with Qwen2's normalizer (NFC) and split pattern (\\p{N} one
  digit at a time), <|endoftext|> <|im_start|> <|im_end|> special and "ctrain" added.

and the package's ids for text.txt (uint16 little-endian): sp.ids16, qwen2.ids16.
tests/unit/test_tokenizer.c checks ctrain's encoder against them.

Usage: build/venv-bench/bin/python tests/torch/gen_tokenizer_sp.py [outdir]
"""
import json
import os
import random
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_text import varied  # noqa: E402
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,  # noqa: E402
                        pre_tokenizers, processors, trainers)

OUT = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/tokenizer"
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus():
    text = []
    for p in sorted(os.listdir("/usr/share/common-licenses")):
        p = os.path.join("/usr/share/common-licenses", p)
        if os.path.isfile(p):
            text.append(open(p, encoding="utf-8", errors="replace").read())
    rng = random.Random(7)
    # no U+0000 in the vocabulary: ctrain's JSON reader cannot hold it in a string
    return [t.replace("\x00", "") for t in text + [varied(rng, 50000) for _ in range(6)]]


def sentencepiece(texts):
    """Trained with Metaspace words, then laid out as Llama 2's file: specials, bytes, rest."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tr = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, special_tokens=["<unk>", "<s>", "</s>"],
                             limit_alphabet=300, show_progress=False)
    tok.train_from_iterator(texts, tr)
    j = json.loads(tok.to_str())
    old = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {}
    for t in ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]:
        vocab[t] = len(vocab)
    for t, _ in old:
        if t not in vocab:
            vocab[t] = len(vocab)
    j["model"].update(vocab=vocab, byte_fallback=True, fuse_unk=True, unk_token="<unk>")
    j["added_tokens"] = [dict(id=vocab[t], content=t, single_word=False, lstrip=False, rstrip=False,
                              normalized=False, special=True) for t in ("<unk>", "<s>", "</s>")]
    tok = Tokenizer.from_str(json.dumps(j))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    j = json.loads(tok.to_str())
    j["pre_tokenizer"] = None
    tok = Tokenizer.from_str(json.dumps(j))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])])
    return tok


def qwen2(texts):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=3000, min_frequency=2,
                             special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, tr)
    tok.add_tokens([AddedToken("ctrain", normalized=False)])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def main():
    texts = corpus()
    with open(os.path.join(OUT, "text.txt"), encoding="utf-8", newline="") as f:
        text = f.read()
    for name, tok in (("sp", sentencepiece(texts)), ("qwen2", qwen2(texts))):
        tok.save(os.path.join(OUT, name + ".json"), pretty=False)
        ids = tok.encode(text, add_special_tokens=False).ids
        with open(os.path.join(OUT, name + ".ids16"), "wb") as f:
            f.write(struct.pack(f"<{len(ids)}H", *ids))
        print(f"{name}: {len(text.encode())} bytes of text, {len(ids)} ids, vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
