//! AVX-512 activation quantization: the same IEEE operations as the scalar
//! [`super::dot::quantize_row_q8_scalar`] (max of |x|, one multiply by the
//! reciprocal scale, truncate and step away from zero on halves, clamp), so
//! the blocks are bit-identical, 16 lanes at a time. The same for the
//! K-quants' 256-value [`Q8KBlock`]s ([`quantize_row_k`]).

use super::dot::{Q8Block, QK};
use super::dequant::QK_K;
use super::kquant::Q8KBlock;

/// Whether this CPU can run [`quantize_row`].
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Quantize `x` into `out`; the caller has checked [`available`].
#[cfg(target_arch = "x86_64")]
pub fn quantize_row(x: &[f32], out: &mut [Q8Block]) {
    assert!(available(), "quantize_row needs AVX-512F/BW");
    for (chunk, block) in x.chunks_exact(QK).zip(out.iter_mut()) {
        // SAFETY: AVX-512F/BW checked above; `chunk` holds exactly QK = 32 values.
        unsafe { quantize_block(chunk, block) }
    }
}

/// Never called off x86-64 ([`available`] is false there).
#[cfg(not(target_arch = "x86_64"))]
pub fn quantize_row(_x: &[f32], _out: &mut [Q8Block]) {
    unreachable!("quantize_row without AVX-512")
}

/// Quantize `x` into K-quant activation blocks (as
/// [`super::kquant::quantize_row_q8k_scalar`], bit for bit); the caller has
/// checked [`available`].
#[cfg(target_arch = "x86_64")]
pub fn quantize_row_k(x: &[f32], out: &mut [Q8KBlock]) {
    assert!(available(), "quantize_row_k needs AVX-512F/BW");
    for (chunk, block) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        // SAFETY: AVX-512F/BW checked above; `chunk` holds exactly QK_K = 256 values.
        unsafe { quantize_block_k(chunk, block) }
    }
}

/// Never called off x86-64 ([`available`] is false there).
#[cfg(not(target_arch = "x86_64"))]
pub fn quantize_row_k(_x: &[f32], _out: &mut [Q8KBlock]) {
    unreachable!("quantize_row_k without AVX-512")
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_block_k(chunk: &[f32], block: &mut Q8KBlock) {
    use std::arch::x86_64::*;
    // SAFETY (whole body): chunk has 256 readable f32s, block.qs 256 writable bytes.
    unsafe {
        let mut amax = _mm512_setzero_ps();
        for i in 0..QK_K / 16 {
            amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(chunk.as_ptr().add(16 * i))));
        }
        let d = _mm512_reduce_max_ps(amax).max(0.0) / 127.0;
        let inv = _mm512_set1_ps(super::dot::inverse_scale(d));
        for (g, sum) in block.bsums.iter_mut().enumerate() {
            let v = _mm512_loadu_ps(chunk.as_ptr().add(16 * g));
            let q = round_half_away(_mm512_mul_ps(v, inv));
            let q = _mm512_min_epi32(_mm512_max_epi32(q, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
            _mm_storeu_si128(block.qs.as_mut_ptr().add(16 * g) as *mut __m128i, _mm512_cvtepi32_epi8(q));
            *sum = _mm512_reduce_add_epi32(q) as i16;
        }
        block.d = d;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_block(chunk: &[f32], block: &mut Q8Block) {
    use std::arch::x86_64::*;
    // SAFETY (whole body): chunk has 32 readable f32s and block.qs 32 writable bytes.
    unsafe {
        let lo = _mm512_loadu_ps(chunk.as_ptr());
        let hi = _mm512_loadu_ps(chunk.as_ptr().add(16));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi))).max(0.0);
        let d = amax / 127.0;
        let inv = _mm512_set1_ps(super::dot::inverse_scale(d));
        let mut sum = _mm512_setzero_si512();
        for (half, v) in [lo, hi].into_iter().enumerate() {
            let q = round_half_away(_mm512_mul_ps(v, inv));
            let q = _mm512_min_epi32(_mm512_max_epi32(q, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
            sum = _mm512_add_epi32(sum, q);
            _mm_storeu_si128(block.qs.as_mut_ptr().add(16 * half) as *mut __m128i, _mm512_cvtepi32_epi8(q));
        }
        let total = _mm512_reduce_add_epi32(sum);
        block.d = d;
        block.s = d * total as f32;
        block.qsum = total;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn round_half_away(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let t = _mm512_cvttps_epi32(x);
    let frac = _mm512_sub_ps(x, _mm512_cvtepi32_ps(t));
    let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, _mm512_set1_ps(0.5));
    let down = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(frac, _mm512_set1_ps(-0.5));
    let one = _mm512_set1_epi32(1);
    let rounded_up = _mm512_mask_add_epi32(t, up, t, one);
    _mm512_mask_sub_epi32(rounded_up, down, rounded_up, one)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::quant::dot::quantize_row_q8_scalar;

    #[test]
    #[cfg_attr(not(host_avx512), ignore = "needs a CPU with AVX-512 F/BW")]
    fn matches_the_scalar_quantizer_bit_for_bit() {
        assert!(available(), "built on a CPU with AVX-512 F/BW, run on one without");
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for case in 0..2000 {
            let scale = [1e-6f32, 0.01, 1.0, 37.0, 1e4][case % 5];
            let mut x: Vec<f32> = (0..4 * QK).map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale).collect();
            // Exact halves after scaling, and all-zero blocks, must agree too.
            x[3] = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0 * 2.5;
            if case % 7 == 0 {
                x[QK..2 * QK].fill(0.0);
            }
            if case % 11 == 0 {
                x[2 * QK..3 * QK].fill(0.0);
                x[2 * QK + 9] = -1e-38;
            }
            let mut simd = vec![Q8Block::default(); 4];
            let mut scalar = vec![Q8Block::default(); 4];
            quantize_row(&x, &mut simd);
            quantize_row_q8_scalar(&x, &mut scalar);
            for (a, b) in simd.iter().zip(&scalar) {
                assert_eq!((a.d.to_bits(), a.s.to_bits(), a.qsum, a.qs), (b.d.to_bits(), b.s.to_bits(), b.qsum, b.qs));
            }
        }
    }

    #[test]
    #[cfg_attr(not(host_avx512), ignore = "needs a CPU with AVX-512 F/BW")]
    fn k_blocks_match_the_scalar_quantizer_bit_for_bit() {
        assert!(available(), "built on a CPU with AVX-512 F/BW, run on one without");
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for case in 0..500 {
            let scale = [1e-6f32, 0.01, 1.0, 37.0, 1e4][case % 5];
            let mut x: Vec<f32> = (0..2 * QK_K).map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale).collect();
            x[5] = x[..QK_K].iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0 * 2.5;
            if case % 7 == 0 {
                x[QK_K..].fill(0.0);
            }
            if case % 11 == 0 {
                // A block so small that 1/d overflows: zeros, not infinities.
                x[QK_K..].fill(0.0);
                x[QK_K + 9] = 1e-38;
            }
            let mut simd = vec![Q8KBlock::default(); 2];
            let mut scalar = vec![Q8KBlock::default(); 2];
            quantize_row_k(&x, &mut simd);
            crate::quant::kquant::quantize_row_q8k_scalar(&x, &mut scalar);
            for (a, b) in simd.iter().zip(&scalar) {
                assert_eq!((a.d.to_bits(), a.bsums, a.qs), (b.d.to_bits(), b.bsums, b.qs));
            }
        }
    }
}
