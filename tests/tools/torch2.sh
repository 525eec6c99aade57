# Sourced by the torchrun tests: $py2 is a Python with PyTorch >= 2 and its torchrun (PYTHON=,
# else /tmp/gpt2-venv) and $v2 its version, or v2 is empty where there is none (CI has only
# Debian's 1.13); $no_torch2 says so in one line.
py2=${PYTHON:-/tmp/gpt2-venv/bin/python}
v2=$("$py2" -c 'import torch, torch.distributed.run; print(torch.__version__)' 2>/dev/null || true)
{ [ -n "$v2" ] && [ "${v2%%.*}" -ge 2 ]; } 2>/dev/null || v2=
no_torch2="PyTorch >= 2 not available (PYTHON=${PYTHON:-unset}, /tmp/gpt2-venv): only Debian's torchrun was run"
