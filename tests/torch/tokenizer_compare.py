#!/usr/bin/env python3
"""Compares ctrain's encoder with the `tokenizers` package on one text, token for token:
for each tokenizer.json, the package's encode (no special tokens added) against the ids
`ctrain tokenize` writes (its shard: a 256-int32 header, then the document start token and
the text's ids, uint16 or uint32). Prints one line per tokenizer; exits 1 on any difference.

Usage: PY tests/torch/tokenizer_compare.py CTRAIN TEXT WORKDIR tokenizer.json...
"""
import os
import struct
import subprocess
import sys
import time

from tokenizers import Tokenizer


def shard_ids(path):
    data = open(path, "rb").read()
    magic, version, count = struct.unpack("<3i", data[:12])
    assert magic == 20240520 and version in (1, 2), (path, magic, version)
    width = "H" if version == 1 else "I"
    return list(struct.unpack(f"<{count}{width}", data[1024:1024 + count * struct.calcsize(width)]))


def main():
    ctrain, text_path, work = sys.argv[1:4]
    text = open(text_path, encoding="utf-8", newline="").read()
    nbytes = len(text.encode())
    bad = 0
    for js in sys.argv[4:]:
        name = os.path.splitext(os.path.basename(js))[0]
        tok = Tokenizer.from_file(js)
        t0 = time.perf_counter()
        want = tok.encode(text, add_special_tokens=False).ids
        dt = time.perf_counter() - t0
        prefix = os.path.join(work, name)
        r = subprocess.run([ctrain, "tokenize", "--tokenizer", js, "--output", prefix, text_path],
                           capture_output=True, text=True)
        if r.returncode:
            print(f"{name}: ctrain tokenize failed: {r.stderr.strip()}")
            bad += 1
            continue
        got = shard_ids(prefix + "_000000.bin")[1:]  # after the document start
        diff = sum(a != b for a, b in zip(got, want)) + abs(len(got) - len(want))
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        print(f"{name}: {nbytes} bytes, tokenizers {len(want)} ids ({nbytes / dt / 1e6:.2f} MB/s), "
              f"ctrain {len(got)} ids, {diff} differ" + (f" (first at {first})" if diff else ""))
        bad += diff > 0
    sys.exit(1 if bad else 0)


main()
