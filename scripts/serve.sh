#!/usr/bin/env bash
# Starts the Spindle daemon on the default model (installing the model first).
# Extra arguments go to `spindle serve` (e.g. --port 8080 --model <name|path>).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh >/dev/null
cargo build --release -p spindle-server
exec target/release/spindle serve "$@"
