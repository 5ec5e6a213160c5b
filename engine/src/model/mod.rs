//! Models built from shared layers, generic over the [`crate::backend`].
//! One file per architecture family; every family here is a Llama-style
//! decoder, so one implementation with config switches (biases, q/k norm,
//! RoPE style) covers Llama 2/3, SmolLM2, Mistral, Qwen2 and Qwen3, on
//! every backend.

pub mod decoder;
pub mod linear;
mod kquant_grouped;
pub mod mlp;
mod refine;
mod sink;
mod token_rows;
pub mod llama;
pub mod ops;

pub use linear::{Linear, MatmulPrecision};
pub use decoder::{Decoder, ModelRunner};
pub use llama::{LlamaModel, LlamaWeights, WeightNaming};

/// A raw pointer that parallel tasks may share to write disjoint elements.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub(crate) *mut f32);
// SAFETY: every user writes only indices it exclusively owns (documented at each use).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}
impl SendPtr {
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}
