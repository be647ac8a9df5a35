#!/usr/bin/env bash
# Install seq2seq into a virtual environment (VENV, default .venv) without ever pulling the CUDA
# build of torch onto a machine that has no NVIDIA driver.
#   TORCH="torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124" make install  # your torch
#   VENV=$VIRTUAL_ENV make install                                                      # your env
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check)

if [ -n "${TORCH:-}" ]; then
  echo "install: torch as asked: $TORCH"
  # shellcheck disable=SC2086  # TORCH may carry pip options such as --index-url
  "${pip[@]}" install $TORCH
elif "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "install: keeping torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
elif command -v nvidia-smi >/dev/null 2>&1; then
  echo "install: NVIDIA driver found: torch==$TORCH_VERSION with CUDA"
  "${pip[@]}" install "torch==$TORCH_VERSION"
else
  echo "install: no NVIDIA driver: CPU-only torch==$TORCH_VERSION+cpu"
  # A local wheel (pip's find-links) first; else PyTorch's CPU index. Never the CUDA wheels.
  "${pip[@]}" install "torch==$TORCH_VERSION+cpu" 2>/dev/null \
    || "${pip[@]}" install "torch==$TORCH_VERSION" \
      --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple
fi
# the dev extra, with every version pinned by constraints.txt (reproducible CI)
"${pip[@]}" install -e ".[dev]" -c constraints.txt
"$VENV/bin/python" -c "import torch, seq2seq; print('install: ok, torch', torch.__version__, \
'cuda' if torch.cuda.is_available() else 'cpu')"
