#!/usr/bin/env python3
"""One-thread encode throughput of Hugging Face's `tokenizers`, the reference for
build/bench/tokenizer_bench (bench/run.sh runs both on the same text, interleaved).
Prints one line per tokenizer: the best of REPEATS timed encodes of the whole text, and of
encode_batch over its lines (how the package is fed in data pipelines).

Usage: RAYON_NUM_THREADS=1 PY bench/tokenizers_ref.py TEXT REPEATS tokenizer.json...
"""
import os
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import Tokenizer  # noqa: E402


def best(f, reps):
    """The best wall time and the best CPU time of reps calls."""
    t, c = float("inf"), float("inf")
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        f()
        c = min(c, time.process_time() - c0)
        t = min(t, time.perf_counter() - t0)
    return t, c


def main():
    path, reps = sys.argv[1], int(sys.argv[2])
    text = open(path, encoding="utf-8", newline="").read()
    lines = text.splitlines(keepends=True)
    nbytes = len(text.encode())
    for js in sys.argv[3:]:
        tok = Tokenizer.from_file(js)
        n = len(tok.encode(text, add_special_tokens=False).ids)
        whole, whole_cpu = best(lambda: tok.encode(text, add_special_tokens=False), reps)
        batch, batch_cpu = best(lambda: tok.encode_batch(lines, add_special_tokens=False), reps)
        print(f"{js}: {nbytes} bytes -> {n} ids, {nbytes / whole / 1e6:.2f} MB/s whole text, "
              f"{nbytes / batch / 1e6:.2f} MB/s by lines, {nbytes / whole_cpu / 1e6:.2f} and "
              f"{nbytes / batch_cpu / 1e6:.2f} MB/s of CPU time "
              f"(tokenizers {__import__('tokenizers').__version__}, one thread)")


main()
