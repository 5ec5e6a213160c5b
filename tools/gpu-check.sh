#!/usr/bin/env bash
# The prepared GPU check (issue 6, part 7), in two steps:
#
#   tools/gpu-check.sh prepare   # here (no GPU needed): builds the CUDA kernel
#                                # tests and benchmarks into gpu-check/bin
#   tools/gpu-check.sh run       # on the device machine (no Rust there), with
#                                # gpu-check/bin carried: correctness, sanitizers,
#                                # benchmarks (attention GB/s, 8B-shape decode and
#                                # prefill tok/s); a report in $OUT (or gpu-check/)
#
# `run` needs only the NVIDIA driver; compute-sanitizer is used when found
# (PATH, CUDA_HOME or /usr/local/cuda). Exit status: 1 if a correctness
# check failed, else 0.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=gpu-check/bin

prepare() {
    bash scripts/install-nvcc.sh >/dev/null
    mkdir -p "$BIN"
    local test_bin
    test_bin=$(cargo test --release -p spindle-kernels --features cuda --test gpu_kernels --no-run --message-format=json 2>/dev/null \
        | grep -o '"executable":"[^"]*gpu_kernels[^"]*"' | tail -1 | cut -d'"' -f4 || true)
    [ -n "$test_bin" ] || { echo "could not build the kernel tests" >&2; exit 1; }
    cp "$test_bin" "$BIN/gpu_kernels"
    test_bin=$(cargo test --release -p spindle-tests --features cuda --test cuda_forward --no-run --message-format=json 2>/dev/null \
        | grep -o '"executable":"[^"]*cuda_forward[^"]*"' | tail -1 | cut -d'"' -f4 || true)
    [ -n "$test_bin" ] || { echo "could not build the backend tests" >&2; exit 1; }
    cp "$test_bin" "$BIN/cuda_forward"
    cargo build --release -p spindle-kernels --features cuda --example paged_decode_bench
    cp target/release/examples/paged_decode_bench "$BIN/"
    cargo build --release -p spindle-kernels --features cuda --example gemm_bench
    cp target/release/examples/gemm_bench "$BIN/"
    cargo build --release -p spindle-benches --features cuda --bin gpu-model-bench
    cp target/release/gpu-model-bench "$BIN/"
    strip "$BIN"/* 2>/dev/null || true  # (64 MiB travel to the device)
    ls -l "$BIN"
}

find_sanitizer() {
    for c in compute-sanitizer "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer; do
        if command -v "$c" >/dev/null 2>&1; then command -v "$c"; return; fi
    done
}

# cuBLAS is loaded at run time; on the device machine it ships in PyTorch's
# nvidia wheels, off the default library path.
find_cublas() {
    local lib
    lib=$(find /opt /usr/local /usr/lib -name 'libcublas.so.13*' 2>/dev/null | head -1 || true)
    [ -n "$lib" ] && dirname "$lib"
}

run() {
    local out=${OUT:-gpu-check}
    local cublas_dir
    cublas_dir=$(find_cublas || true)
    if [ -n "$cublas_dir" ]; then export LD_LIBRARY_PATH="$cublas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
    mkdir -p "$out"
    local report="$out/gpu-check.md" status=0
    {
        echo "# GPU check $(date -u +%FT%TZ)"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/device: /' || true
        echo
        echo "## Kernel correctness (GPU vs CPU reference)"
        echo '```'
    } > "$report"
    if "$BIN/gpu_kernels" --test-threads=1 --nocapture >> "$report" 2>&1; then echo "kernels: ok"; else echo "kernels: FAILED"; status=1; fi
    echo '```' >> "$report"
    {
        echo "## Whole model: CUDA backend vs CPU backend (tiny Llama, tiny Qwen3; SmolLM2 if SPINDLE_MODEL_GGUF is set)"
        echo '```'
    } >> "$report"
    if "$BIN/cuda_forward" --test-threads=1 --nocapture >> "$report" 2>&1; then echo "backend: ok"; else echo "backend: FAILED"; status=1; fi
    echo '```' >> "$report"
    local sanitizer
    sanitizer=$(find_sanitizer || true)
    for run in "memcheck gpu_kernels" "racecheck gpu_kernels" "memcheck cuda_forward"; do
        set -- $run
        echo "## compute-sanitizer $1 on $2" >> "$report"
        if [ -z "$sanitizer" ]; then echo "not found on this machine" >> "$report"; continue; fi
        echo '```' >> "$report"
        if "$sanitizer" --tool "$1" --error-exitcode 9 "$BIN/$2" --test-threads=1 >> "$report" 2>&1; then
            echo "$1 $2: clean"
        else
            echo "$1 $2: ERRORS"; status=1
        fi
        echo '```' >> "$report"
    done
    {
        echo "## Paged decode attention bandwidth (8B geometry: 32 q heads, 8 kv heads, head_dim 128)"
        echo '```'
        "$BIN/paged_decode_bench" 2>&1 || true
        echo '```'
        echo "## Linear-layer GEMMs: cuBLAS vs Spindle's kernels (8B layer shapes)"
        echo "cuBLAS from: ${cublas_dir:-not found}"
        echo '```'
        timeout 120 "$BIN/gemm_bench" 2>&1 || echo "(gemm_bench did not finish: exit $?)"
        echo '```'
        echo "## Whole model, Llama-3.1-8B shapes, random bf16 weights"
        echo '```'
        timeout 420 "$BIN/gpu-model-bench" 2>&1 || echo "(gpu-model-bench did not finish: exit $?)"
        echo '```'
    } >> "$report"
    cat "$report"
    return $status
}

case "${1:-}" in
    prepare) prepare ;;
    run) run ;;
    *) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
