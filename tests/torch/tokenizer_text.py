#!/usr/bin/env python3
"""Writes the tokenizers' large check text (at least 1 MB, UTF-8): every file of
/usr/share/common-licenses (package base-files, on every Debian system) and text generated
from a fixed seed: words of many scripts (Latin with diacritics, Greek, Cyrillic, Hebrew and
Arabic with their points, Devanagari, Thai, Hangul syllables and jamo, kana, CJK, Ext B),
combining marks alone and stacked (composed and decomposed forms, for NFC), emoji with ZWJ,
skin tones and flags, digit runs in several scripts, whitespace runs (NBSP, U+3000, CRLF,
tabs), contractions, control characters and special tokens inline. Standard library only, so
that any Python 3 makes the same text from the same licenses.

Usage: python3 tests/torch/tokenizer_text.py OUT [min_bytes]
"""
import glob
import os
import random
import sys
import unicodedata

BLOCKS = [(0x41, 0x7A), (0xC0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x591, 0x5F4),
          (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE5B), (0x1100, 0x11FF), (0x1E00, 0x1EFF), (0x3040, 0x30FF),
          (0x4E00, 0x4FFF), (0xAC00, 0xD7A3), (0x1F300, 0x1F64F), (0x1F900, 0x1F9FF), (0x2000, 0x206F),
          (0x2100, 0x218B), (0xFF01, 0xFF9F), (0x10400, 0x1044F), (0x1D400, 0x1D4FF), (0x20000, 0x200FF),
          (0xF900, 0xFAFF), (0x2F800, 0x2FA1D)]
PIECES = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'ſ", "n't", "I'm", "we'll", "'x",
          " ", "  ", "   ", "     ", "\t", "\t\t ", "\n", "\n\n", "\r\n", " \n ", "\n \n", "\u00a0", "\u3000",
          "\u2009", "\u0085", "\u2028", "12345678", "3.14159", "1,000,000", "٣٤٥٦", "१२३४", "１２３", "Ⅻ", "²³",
          "e\u0301", "a\u0308\u0304", "o\u0323\u0302", "o\u0302\u0323", "\u1100\u1161\u11a8", "\u212b",
          "\u2126", "\u0958", "\u0344", "\u0f73", "Å", "ệ", "👩\u200d💻", "👍🏽", "🇩🇪", "🇯🇵", "\u200b",
          "<|endoftext|>", " <|endoftext|>", "<|begin_of_text|>", "<s>", " </s>", "<unk>", "ctrain", " ctrain",
          "--", "...", "\U0001F600", "é", "\x00", "\x1f", "\x7f", "ß", "İ", "ǅ", "▁", "▁▁x", "<0x41>"]
WORDS = ["the", "The", "licence", "Software", "GNU", "free", "x", "of", "copy", "Straße", "naïve", "日本語",
         "Ελληνικά", "русский", "עברית", "العربية", "हिन्दी", "ภาษาไทย", "한국어", "かな", "中文"]
SEPS = ["", " ", " ", " ", "  ", "\n", ", ", "\t", ". ", "\n\n"]


def assigned(c):
    return unicodedata.category(c) not in ("Cn", "Cs", "Co")


def varied(rng, n_bytes):
    out, size = [], 0
    while size < n_bytes:
        r = rng.random()
        if r < 0.3:
            w = rng.choice(PIECES)
        elif r < 0.65:
            lo, hi = rng.choice(BLOCKS)
            w = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8)))
        elif r < 0.7:
            w = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 12)))
        else:
            w = rng.choice(WORDS)
        w = "".join(c for c in w + rng.choice(SEPS) if assigned(c) or c == "\x00")
        out.append(w)
        size += len(w.encode())
    return "".join(out)


def main():
    out = sys.argv[1]
    min_bytes = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 20
    rng = random.Random(20261202)
    parts = []
    for p in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(p):
            parts.append(open(p, encoding="utf-8", errors="replace").read())
    lic = "".join(parts)
    # licences and generated text interleaved in chunks, so every tokenizer sees both
    text, i = [], 0
    while sum(len(t.encode()) for t in text) < min_bytes:
        text.append(lic[i:i + 20000])
        i = i + 20000 if i + 20000 < len(lic) else 0
        text.append(varied(rng, 40000))
    with open(out, "w", encoding="utf-8", newline="") as f:
        f.write("".join(text))


if __name__ == "__main__":
    main()
