#!/usr/bin/env bash
# Tokenizer encode throughput, one thread, ctrain (build/bench/tokenizer_bench) against
# Hugging Face's `tokenizers` (bench/tokenizers_ref.py, RAYON_NUM_THREADS=1) on the same
# texts and the same four fixture tokenizers, run interleaved REPEAT times; the tables keep
# each side's best, by wall time and by CPU time (on a loaded machine the CPU time shows
# the work, the wall time the waiting too). `make bench` runs it. Texts: 1.1 MB of mixed
# text (tests/torch/tokenizer_text.py: scripts, emoji, CJK, combining marks, digit and
# whitespace runs, license texts) and the English of /usr/share/common-licenses.
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
[ -n "$PY" ] || echo "bench: no Python with tokenizers (bash scripts/setup-interop.sh puts it in build/venv-tb); ctrain only" >&2
mkdir -p build/bench
mixed=build/bench/tokenizer_mixed.txt english=build/bench/tokenizer_english.txt
python3 tests/torch/tokenizer_text.py "$mixed" 1100000 || exit 1
find /usr/share/common-licenses -maxdepth 1 -type f | sort | xargs cat > "$english"
F=tests/fixtures/tokenizer
log=build/bench/tokenizers.txt
: >"$log"
echo "MACHINE cpu=\"$(lscpu | sed -n 's/^Model name: *//p')\" family=$(lscpu | sed -n 's/^CPU family: *//p') model=$(lscpu | sed -n 's/^Model: *//p') load=\"$(cut -d' ' -f1-3 /proc/loadavg)\" date=$(date -u +%FT%TZ)"
for r in $(seq "$REPEAT"); do
    for text in "$mixed" "$english"; do
        for k in gpt2 llama3 qwen2 sp; do
            "$CT" "$F/$k.json" "$text" 5 | sed "s|^|$text |" | tee -a "$log"
            [ -n "$PY" ] && RAYON_NUM_THREADS=1 "$PY" bench/tokenizers_ref.py "$text" 2 "$F/$k.json" | sed "s|^|$text |" | tee -a "$log"
        done
    done
done
echo "MACHINE_END load=\"$(cut -d' ' -f1-3 /proc/loadavg)\""
# each column: the best over the runs (sed picks the figure, sort -g the largest)
col() { grep "^$1 .*/$2.json: .*($3" "$log" | sed -n "s/$4/\\1/p" | sort -g | tail -1; }
num='\([0-9.]*\)'
for text in "$mixed" "$english"; do
    echo
    echo "| $(basename "$text") ($(stat -c %s "$text") bytes), MB/s | ctrain | tokenizers, whole text | tokenizers, by lines | ctrain, CPU time | tokenizers whole, CPU time | tokenizers lines, CPU time |"
    echo "|---|---|---|---|---|---|---|"
    for k in gpt2 llama3 qwen2 sp; do
        c=$(col "$text" $k ctrain ".*ids, $num MB\/s, .*")
        cc=$(col "$text" $k ctrain ".*, $num MB\/s of CPU time.*")
        w=$(col "$text" $k tokenizers ".*ids, $num MB\/s whole text.*")
        l=$(col "$text" $k tokenizers ".*, $num MB\/s by lines.*")
        wc=$(col "$text" $k tokenizers ".*lines, $num and .*")
        lc=$(col "$text" $k tokenizers ".* and $num MB\/s of CPU.*")
        echo "| $k | ${c:--} | ${w:--} | ${l:--} | ${cc:--} | ${wc:--} | ${lc:--} |"
    done
done
