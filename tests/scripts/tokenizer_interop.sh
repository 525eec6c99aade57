#!/usr/bin/env bash
# ctrain's tokenizers against the `tokenizers` package on over 1 MB of varied text, token
# for token, one tokenizer of each kind (tests/fixtures/tokenizer/): GPT-2's byte-level BPE,
# Llama 3's split pattern, Qwen2's pattern with NFC, SentencePiece-style BPE with byte
# fallback (Llama 2). The text is made here (tests/torch/tokenizer_text.py: Debian's license
# texts and seeded generated text) and the package encodes it live, so the reference is
# the package's and no large fixture is kept. `tokenizers` comes pinned in the venv that
# scripts/setup-interop.sh makes (build/venv-tb); the test skips where it is missing.
cd "$(dirname "$0")/../.." || exit 1
PY=build/venv-tb/bin/python
if ! [ -x "$PY" ] || ! "$PY" -c "import tokenizers" 2>/dev/null; then
    echo "tokenizers not importable by $PY (bash scripts/setup-interop.sh installs it)"
    exit 77
fi
C=${CT_BUILD:-build}/ctrain
[ -x "$C" ] || { echo "$C not built"; exit 1; }
dir=$(mktemp -d /tmp/ct_tok_interop_XXXXXX)
trap 'rm -rf "$dir"' EXIT
"$PY" tests/torch/tokenizer_text.py "$dir/text.txt" 1100000 || exit 1
size=$(stat -c %s "$dir/text.txt")
[ "$size" -ge 1048576 ] || { echo "text of $size bytes, under 1 MB"; exit 1; }
F=tests/fixtures/tokenizer
# sp.json as newer files put Llama 2: no normalizer, a Metaspace pre-tokenizer (prepend
# "first", no split, as transformers writes it; and "always" with split)
"$PY" - "$F/sp.json" "$dir" <<'PYEOF' || exit 1
import json, sys
j = json.load(open(sys.argv[1], encoding="utf-8"))
j["normalizer"] = None
for name, scheme, split in (("sp_meta_first", "first", False), ("sp_meta_split", "always", True)):
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme, "split": split}
    j["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme, "split": split}
    json.dump(j, open(f"{sys.argv[2]}/{name}.json", "w", encoding="utf-8"), ensure_ascii=False)
PYEOF
"$PY" tests/torch/tokenizer_compare.py "$C" "$dir/text.txt" "$dir" $F/gpt2.json $F/llama3.json $F/qwen2.json $F/sp.json \
    "$dir/sp_meta_first.json" "$dir/sp_meta_split.json"
