#!/usr/bin/env bash
# Tokenizer encode throughput, one thread, ctrain (build/bench/tokenizer_bench) against
# Hugging Face's `tokenizers` (bench/tokenizers_ref.py, RAYON_NUM_THREADS=1) on the same
# 1.1 MB text (tests/torch/tokenizer_text.py) and the same four fixture tokenizers, run
# interleaved REPEAT times; the table keeps each side's best. `make bench` runs it.
# Environment: PYTHON (an interpreter with tokenizers; default build/venv-bench, then
# build/venv-tb), REPEAT (default 2).
set -u
cd "$(dirname "$0")/.." || exit 1
REPEAT=${REPEAT:-2}
CT=build/bench/tokenizer_bench
[ -x "$CT" ] || { echo "build first: make -j2" >&2; exit 1; }
PY=
for p in ${PYTHON:-} build/venv-bench/bin/python build/venv-tb/bin/python; do
    if [ -x "$p" ] && "$p" -c "import tokenizers" 2>/dev/null; then PY=$p; break; fi
done
text=build/bench/tokenizer_text.txt
mkdir -p build/bench
python3 tests/torch/tokenizer_text.py "$text" 1100000 || exit 1
F=tests/fixtures/tokenizer
log=build/bench/tokenizers.txt
: >"$log"
for r in $(seq "$REPEAT"); do
    for k in gpt2 llama3 qwen2 sp; do
        "$CT" "$F/$k.json" "$text" 5 | tee -a "$log"
        [ -n "$PY" ] && RAYON_NUM_THREADS=1 "$PY" bench/tokenizers_ref.py "$text" 2 "$F/$k.json" | tee -a "$log"
    done
done
[ -n "$PY" ] || echo "bench: no Python with tokenizers (bash scripts/setup-interop.sh puts it in build/venv-tb); ctrain only" >&2
echo
echo "| tokenizer ($(stat -c %s "$text") bytes of mixed text) | ctrain MB/s | tokenizers MB/s, whole text | tokenizers MB/s, by lines |"
echo "|---|---|---|---|"
for k in gpt2 llama3 qwen2 sp; do
    c=$(grep "/$k.json: .*(ctrain" "$log" | sed -n 's/.* \([0-9.]*\) MB\/s, .*/\1/p' | sort -g | tail -1)
    w=$(grep "/$k.json: .*(tokenizers" "$log" | sed -n 's/.*, \([0-9.]*\) MB\/s whole text.*/\1/p' | sort -g | tail -1)
    l=$(grep "/$k.json: .*(tokenizers" "$log" | sed -n 's/.*, \([0-9.]*\) MB\/s by lines.*/\1/p' | sort -g | tail -1)
    echo "| $k | ${c:--} | ${w:--} | ${l:--} |"
done
