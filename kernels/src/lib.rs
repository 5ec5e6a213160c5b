//! Spindle's CUDA kernels. With the `cuda` feature, build.rs compiles
//! `kernels/cuda/*.cu` with nvcc 13.0 into a cubin for sm_90a (H100/H200)
//! and PTX for compute_90, and [`MODULES`] embeds them, so the binary needs
//! only the driver at run time. Without the feature the crate is empty.
//!
//! Kernels so far (bf16 data, f32 math): `add_rmsnorm_bf16` (RMSNorm with
//! the residual add fused), `silu_mul_bf16`, `gelu_tanh_mul_bf16`,
//! `scale_bf16`, `embedding_bf16`,
//! `rope_neox_bf16`, `kv_write_bf16` (new keys/values into their paged
//! slots) and `paged_decode_bf16` / `paged_decode_gqa_bf16` (one block per
//! query head, or per KV head for all its query heads) + `decode_reduce_bf16`
//! (decode attention over the paged cache, GQA, split along the context), `gemm_bf16` /
//! `gemm_bf16_f32out` (linear layers, f32 accumulation, CUDA cores),
//! `gemm_tc_bf16` / `gemm_tc_bf16_f32out` (the same on tensor cores, WMMA),
//! `gemv_bf16` /
//! `gemv_bf16_f32out` (decode steps of up to 8 rows, 16-byte weight loads),
//! `gemv_jobs_bf16` (several such layers sharing an input, one launch) and
//! `rope_table_bf16` (RoPE from host-computed tables) and
//! `paged_prefill_bf16` (causal flash-attention prefill over the paged
//! cache, WMMA, online softmax) and `sample_rows_f32` (greedy or
//! temperature / top-k / top-p / min-p sampling of logits rows), launched through [`device::Gpu`] and checked against CPU
//! references by `tests/gpu_kernels.rs` on a machine with a GPU. The engine's
//! CUDA backend (`spindle-engine`, feature `cuda`) runs models with them.

/// One compiled `.cu` file.
#[derive(Debug, Clone, Copy)]
pub struct Module {
    /// The file's stem (`norm` for `norm.cu`).
    pub name: &'static str,
    /// SASS for sm_90a.
    pub cubin: &'static [u8],
    /// PTX for compute_90 (the driver JITs it on newer GPUs).
    pub ptx: &'static str,
    /// The `extern "C"` kernels it defines.
    pub functions: &'static [&'static str],
}

#[cfg(feature = "cuda")]
include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

#[cfg(feature = "cuda")]
pub mod device;

/// The compiled kernel files (none without the `cuda` feature).
#[cfg(not(feature = "cuda"))]
pub const MODULES: &[Module] = &[];

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::*;

    /// Every kernel compiled: SASS for sm_90a, and PTX of ISA 9.0 (what the
    /// H200's driver 580 can load; a newer nvcc would write a newer ISA).
    #[test]
    fn every_kernel_is_embedded_as_sm90a_sass_and_isa_9_0_ptx() {
        let mut names: Vec<&str> = MODULES.iter().flat_map(|m| m.functions.iter().copied()).collect();
        names.sort_unstable();
        assert_eq!(names, ["add_bias_bf16", "add_rmsnorm_bf16", "decode_reduce_bf16", "embedding_bf16", "gelu_tanh_mul_bf16", "gemm_bf16", "gemm_bf16_f32out", "gemm_tc_bf16", "gemm_tc_bf16_f32out", "gemv_bf16", "gemv_bf16_f32out", "gemv_jobs_bf16", "kv_write_bf16", "paged_decode_bf16", "paged_decode_gqa_bf16", "paged_prefill_bf16", "rope_neox_bf16", "rope_table_bf16", "sample_rows_f32", "scale_bf16", "silu_mul_bf16"]);
        for m in MODULES {
            assert_eq!(&m.cubin[..4], b"\x7fELF", "{}: cubin is an ELF image", m.name);
            assert!(m.ptx.contains(".version 9.0"), "{}: PTX ISA must stay 9.0", m.name);
            assert!(m.ptx.contains(".target sm_90"), "{}", m.name);
            for f in m.functions {
                assert!(m.ptx.contains(&format!(".entry {f}(")), "{}: {f} missing from the PTX", m.name);
            }
        }
    }
}
