//! The element types a KV cache row can hold: `f32`, or `f16` (half the
//! bytes to stream at decode). Kernels read either through [`KvElement`];
//! an `f16` widens to `f32` exactly, so a kernel's arithmetic, and its bits,
//! are those of the same kernel over the widened rows.

use half::f16;

mod sealed {
    /// Only this module's types are KV elements (the kernels' `unsafe`
    /// loads rely on their exact layouts).
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
}

/// One stored key or value: widened to `f32` before any arithmetic. Sealed:
/// implemented for `f32` and `f16` only.
pub trait KvElement: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The value as an `f32` (exact for both types).
    fn to_f32(self) -> f32;

    /// Eight consecutive values from `p`, widened.
    ///
    /// # Safety
    /// `p..p + 8` must be readable, and the caller must run with AVX2 and
    /// F16C enabled (it is inlined into such callers).
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;

    /// Sixteen consecutive values from `p`, widened.
    ///
    /// # Safety
    /// `p..p + 16` must be readable, and the caller must run with AVX-512F
    /// enabled (it is inlined into such callers).
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
}

impl KvElement for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller guarantees 8 readable values and AVX.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller guarantees 16 readable values and AVX-512F.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
}

impl KvElement for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{_mm256_cvtph_ps, _mm_loadu_si128, __m128i};
        // SAFETY: the caller guarantees 8 readable values (16 bytes) and F16C.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<__m128i>())) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::{_mm256_loadu_si256, _mm512_cvtph_ps, __m256i};
        // SAFETY: the caller guarantees 16 readable values (32 bytes) and AVX-512F.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast::<__m256i>())) }
    }
}

/// The largest finite `f16`: rows are clamped to ±this before narrowing,
/// so an outlier saturates instead of becoming an infinity (and then NaN
/// scores).
const F16_MAX: f32 = 65504.0;

/// `out[i] = src[i]` rounded to the nearest `f16` (ties to even), after
/// clamping to the finite range. Panics if the lengths differ.
pub fn narrow_to_f16(out: &mut [f16], src: &[f32]) {
    use half::slice::HalfFloatSliceExt;
    assert_eq!(out.len(), src.len(), "narrow_to_f16: lengths differ");
    let mut clamped = [0f32; 64];
    for (o, s) in out.chunks_mut(64).zip(src.chunks(64)) {
        let tmp = &mut clamped[..s.len()];
        for (t, &v) in tmp.iter_mut().zip(s) {
            *t = v.clamp(-F16_MAX, F16_MAX);
        }
        o.convert_from_f32_slice(tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrowing_rounds_to_nearest_even_and_saturates() {
        let src = [1.0f32, 1.0 + 1.0 / 2048.0, 1.0 + 3.0 / 2048.0, -2.5e-6, 1e9, -1e9, 65519.0, 0.0];
        let mut out = [f16::ZERO; 8];
        narrow_to_f16(&mut out, &src);
        let got: Vec<f32> = out.iter().map(|v| v.to_f32()).collect();
        // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even is 1; 1 + 3·2^-11 goes up to 1 + 2^-9.
        assert_eq!(got[..3], [1.0, 1.0, 1.0 + 1.0 / 512.0]);
        assert_eq!(got[3], f16::from_f32(-2.5e-6).to_f32(), "subnormals round like the scalar conversion");
        assert_eq!(got[4..7], [65504.0, -65504.0, 65504.0], "outliers saturate, never become infinities");
        let long: Vec<f32> = (0..200).map(|i| (i as f32 - 100.0) * 0.37).collect();
        let mut narrowed = vec![f16::ZERO; 200];
        narrow_to_f16(&mut narrowed, &long);
        assert!(narrowed.iter().zip(&long).all(|(n, &v)| n.to_bits() == f16::from_f32(v).to_bits()), "every chunk, on any path");
    }
}
