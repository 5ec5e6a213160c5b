#!/usr/bin/env bash
# Installs the pinned CUDA 13.0 compiler wheels from PyPI into .venv-cuda and
# prints nvcc's path (last line). CUDA 13.0.x on purpose: a newer nvcc writes
# PTX that the H200 driver 580 (CUDA 13.0) cannot load. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$PWD/.venv-cuda"
if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
    nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
nvcc=$(ls "$venv"/lib/python3*/site-packages/nvidia/cu13/bin/nvcc | head -n 1)
"$nvcc" --version | tail -n 2 >&2
echo "$nvcc"
