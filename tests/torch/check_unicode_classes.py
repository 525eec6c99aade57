#!/usr/bin/env python3
"""Checks src/text/unicode_table.c against the regex engine of the `tokenizers` package:
for every code point (surrogates left out), \\p{L}, \\p{N} and \\s as the package's split
patterns see them must match the generated table for every code point that table's data assigns.
Prints the differences.

Usage: build/venv-tok/bin/python tests/torch/check_unicode_classes.py
"""
import re
import sys
from tokenizers import pre_tokenizers, Regex

src = open("src/text/unicode_table.c").read()
table = {}
for name in ("letter", "number", "space"):
    body = src.split(f"ct_uc_{name}_ranges[][2] = {{")[1].split("};")[0]
    cps = set()
    for a, b in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}", body):
        cps.update(range(int(a, 16), int(b, 16) + 1))
    table[name] = cps

assigned = set()
first = None
for line in open("/usr/share/unicode/UnicodeData.txt", encoding="utf-8"):
    f = line.split(";")
    cp = int(f[0], 16)
    if f[1].endswith(", First>"):
        first = cp
        continue
    assigned.update(range(first if f[1].endswith(", Last>") else cp, cp + 1))
    first = None

chars = [c for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]
text = "".join(map(chr, chars))
bad = 0
for name, cls in (("letter", r"\p{L}"), ("number", r"\p{N}"), ("space", r"\s")):
    rem = pre_tokenizers.Split(Regex(cls), behavior="removed").pre_tokenize_str(text)
    kept = set()
    for piece, (s, e) in rem:
        kept.update(ord(ch) for ch in piece)
    got = set(chars) - kept
    # The package's regex engine (Oniguruma) carries a newer Unicode than Debian's data:
    # code points assigned since then are not in the table (they count as "other" here).
    diff = {c for c in got ^ table[name] if c in assigned}
    print(f"{name}: {len(got ^ table[name]) - len(diff)} differ among code points the UCD "
          "here leaves unassigned")
    print(f"{name}: tokenizers {len(got)}, table {len(table[name])}, differ {len(diff)}"
          + (": " + " ".join(f"U+{c:04X}" for c in sorted(diff)[:20]) if diff else ""))
    bad += len(diff)
sys.exit(1 if bad else 0)
