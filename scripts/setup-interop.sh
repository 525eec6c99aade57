#!/usr/bin/env bash
# Installs the real tools the interop tests check ctrain against (idempotent):
#   - Debian's python3-torch (PyTorch 1.13, into /usr/bin/python3): PyTorch loads ctrain's
#     weights with load_state_dict(strict=True) and reproduces its logits;
#   - TensorBoard from PyPI into a virtual environment, build/venv-tb (Debian ships no
#     TensorBoard): its EventAccumulator reads ctrain's event files;
#   - tcpdump: tests/scripts/multinode_sniff.sh captures the link between two nodes and looks
#     for the store's secret in what it saw;
#   - Hugging Face's `tokenizers` from PyPI into the same venv (one wheel, without its
#     hub client: nothing is downloaded from the hub): tests/scripts/tokenizer_interop.sh
#     compares ctrain's encoders with it on 1 MB of text;
#   - unicode-data and bzip2: test_tokenizer checks NFC against Unicode's NormalizationTest.
# Without them those tests skip, saying what is missing (test_tokenizer fails without
# unicode-data). CI (.ci/run) runs this after
# scripts/setup.sh so that they always run there.
# `make clean` removes build/ and the venv with it: run this again after one.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/venv-tb  # where tests/scripts/metrics_tensorboard.sh looks
# Pinned so that a CI run tests against the same reader every time.
TB_VERSION=2.21.0
TOK_VERSION=0.23.3

pkgs=(python3-torch python3-venv python3-pip tcpdump unicode-data bzip2)
. scripts/apt-missing.sh
apt_missing setup-interop "${pkgs[@]}"
/usr/bin/python3 -c "import torch" || { echo "setup-interop: /usr/bin/python3 cannot import torch"; exit 1; }

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import tensorboard" 2>/dev/null; then
    echo "setup-interop: tensorboard present in $venv"
else
    echo "setup-interop: tensorboard $TB_VERSION into $venv"
    rm -rf "$venv"
    # Debian's interpreter, not whatever python3 comes first on PATH: the venv must outlive
    # a user's shell setup.
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "tensorboard==$TB_VERSION"
fi
if [ "$("$venv/bin/python" -c 'import tokenizers; print(tokenizers.__version__)' 2>/dev/null)" != "$TOK_VERSION" ]; then
    echo "setup-interop: tokenizers $TOK_VERSION into $venv"
    # --no-deps: its one dependency, huggingface_hub, only downloads from the hub
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "tokenizers==$TOK_VERSION"
fi
echo "setup-interop: tokenizers $("$venv/bin/python" -c 'import tokenizers; print(tokenizers.__version__)') in $venv"
echo "setup-interop: torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')," \
     "tensorboard $("$venv/bin/python" -c 'import tensorboard; print(tensorboard.__version__)') in $venv"
