#!/usr/bin/env bash
# Starts the Spindle daemon (installing the model first). Without --model,
# --config or SPINDLE_MODEL it serves Qwen2.5-Coder-0.5B-Instruct, the smallest of the
# known models that calls tools (491 MB, from PyPI); `spindle serve` alone
# defaults to SmolLM2-135M-Instruct, the test suite's fast model.
# Extra arguments go to `spindle serve` (e.g. --port 8080 --model <name|path>).
set -euo pipefail
cd "$(dirname "$0")/.."
model=qwen2.5-coder-0.5b-instruct
for arg in "$@"; do
    case "$arg" in --model|--model=*|--config|--config=*) model="" ;; esac
done
[ -n "${SPINDLE_MODEL:-}" ] && model=""
if [ -n "$model" ]; then
    scripts/fetch-model.sh --name "$model" >/dev/null
    set -- --model "$model" "$@"
else
    scripts/fetch-model.sh >/dev/null
fi
cargo build --release -p spindle-server
exec target/release/spindle serve "$@"
