//! Quantizing 16 tokens' activations at once, straight into a
//! [`Q8KGroup`]: the values arrive lane-major (`v[row][token]`, as the
//! grouped kernels produce them), so each token is one lane of a register
//! and the 256-value block's maximum, scale and rounding are the per-token
//! [`quantize_row_q8k`]'s, lane by lane. The result equals quantizing each
//! token with [`quantize_row_q8k`] and interleaving with
//! [`interleave_k`], bit for bit for finite values (tested below; a NaN may
//! take another lane's maximum than the per-token reduction's).

use super::gemm::{interleave_k, Q8KGroup};
use super::{quantize_row_q8k, Q8KBlock, QK_K};
use crate::quant::gemm::GROUP;

/// 256 values (one super-block) of 16 tokens, `v[row][token]`.
pub type Lanes = [[f32; GROUP]; QK_K];

/// Quantizes `v` (every lane a token) into `out`.
pub fn quantize_lanes_k(v: &Lanes, out: &mut Q8KGroup) {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::quantize_avx512::available() {
        // SAFETY: AVX-512F/BW detected.
        unsafe { quantize_lanes_avx512(v, out) };
        return;
    }
    quantize_lanes_reference(v, out);
}

/// [`quantize_lanes_k`] one token at a time: the definition.
pub fn quantize_lanes_reference(v: &Lanes, out: &mut Q8KGroup) {
    let tokens: Vec<f32> = (0..GROUP).flat_map(|lane| v.iter().map(move |row| row[lane])).collect();
    let mut blocks = vec![Q8KBlock::default(); GROUP];
    quantize_row_q8k(&tokens, &mut blocks);
    if let Some(group) = interleave_k(&blocks, GROUP, 1).first() {
        *out = *group;
    }
}

/// [`quantize_lanes_k`] on AVX-512: the per-token block's operations
/// (maximum of |x|, `/ 127`, the guarded reciprocal, one multiply, rounding
/// half away from zero, clamping) on 16 lanes.
///
/// # Safety
/// The CPU must have AVX-512F/BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_lanes_avx512(v: &Lanes, out: &mut Q8KGroup) {
    use crate::quant::quantize_avx512::round_half_away;
    use std::arch::x86_64::*;
    // SAFETY (whole body): every row of `v` is 16 floats; `out`'s rows are
    // 64-byte aligned arrays of 16 lanes.
    unsafe {
        let mut amax = _mm512_setzero_ps();
        for row in v {
            amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(row.as_ptr())));
        }
        let d = _mm512_div_ps(_mm512_max_ps(amax, _mm512_setzero_ps()), _mm512_set1_ps(127.0));
        // `inverse_scale`: 1 / d where d > 0 and that is finite, else 0.
        let inv = _mm512_div_ps(_mm512_set1_ps(1.0), d);
        let usable = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(d, _mm512_setzero_ps())
            & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_abs_ps(inv), _mm512_set1_ps(f32::INFINITY));
        let inv = _mm512_maskz_mov_ps(usable, inv);
        let (lo, hi) = (_mm512_set1_epi32(-127), _mm512_set1_epi32(127));
        let mut sums = [_mm512_setzero_si512(); 16];
        for (k, four) in v.chunks_exact(4).enumerate() {
            let q: [__m512i; 4] = std::array::from_fn(|j| {
                let q = round_half_away(_mm512_mul_ps(_mm512_loadu_ps(four[j].as_ptr()), inv));
                _mm512_min_epi32(_mm512_max_epi32(q, lo), hi)
            });
            let sum = &mut sums[k / 4];
            for qj in q {
                *sum = _mm512_add_epi32(*sum, qj);
            }
            // Lane t: the bytes of rows 4k..4k + 4 of token t.
            let byte = _mm512_set1_epi32(0xff);
            let packed = _mm512_or_si512(
                _mm512_or_si512(_mm512_and_si512(q[0], byte), _mm512_slli_epi32(_mm512_and_si512(q[1], byte), 8)),
                _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(q[2], byte), 16), _mm512_slli_epi32(q[3], 24)),
            );
            _mm512_store_si512(out.qs[k].as_mut_ptr() as *mut __m512i, packed);
        }
        for (s, sum) in sums.iter().enumerate() {
            _mm512_store_si512(out.bsums[s].as_mut_ptr() as *mut __m512i, *sum);
        }
        for p in 0..4 {
            let sub = |j: usize| _mm512_add_epi32(sums[2 * j], sums[2 * j + 1]);
            let pair = _mm512_or_si512(_mm512_and_si512(sub(2 * p), _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(sub(2 * p + 1), 16));
            _mm512_store_si512(out.pairs[p].as_mut_ptr() as *mut __m512i, pair);
        }
        _mm512_store_ps(out.d.as_mut_ptr(), d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::kquant::test_rows::lcg;

    fn assert_groups_equal(a: &Q8KGroup, b: &Q8KGroup, what: &str) {
        assert_eq!(a.qs, b.qs, "{what}: values");
        assert_eq!(a.bsums, b.bsums, "{what}: sums");
        assert_eq!(a.pairs, b.pairs, "{what}: pairs");
        assert_eq!(a.d.map(f32::to_bits), b.d.map(f32::to_bits), "{what}: scales");
    }

    /// Lanes of random values (one all zero, one with a single huge
    /// outlier, halves that round away from zero) quantize as each token
    /// alone, interleaved.
    #[test]
    #[cfg_attr(not(host_avx512), ignore = "needs a CPU with AVX-512 (else both sides are the reference)")]
    fn lanes_quantize_as_each_token_alone() {
        let mut seed = 7u64;
        let mut v: Box<Lanes> = Box::new([[0.0; GROUP]; QK_K]);
        for (r, row) in v.iter_mut().enumerate() {
            for (lane, x) in row.iter_mut().enumerate() {
                *x = match lane {
                    0 => 0.0,
                    1 => if r == 17 { 3.0e4 } else { (lcg(&mut seed) % 2001) as f32 / 1000.0 - 1.0 },
                    2 => (r as f32 - 128.0) * 0.5,
                    _ => ((lcg(&mut seed) % 20001) as f32 / 1000.0 - 10.0) * lane as f32,
                };
            }
        }
        let tokens: Vec<f32> = (0..GROUP).flat_map(|lane| v.iter().map(move |row| row[lane])).collect();
        let mut blocks = vec![Q8KBlock::default(); GROUP];
        quantize_row_q8k(&tokens, &mut blocks);
        let want = interleave_k(&blocks, GROUP, 1);
        let mut got = Q8KGroup::default();
        quantize_lanes_k(&v, &mut got);
        assert_groups_equal(&got, &want[0], "quantize_lanes_k");
        let mut reference = Q8KGroup::default();
        quantize_lanes_reference(&v, &mut reference);
        assert_groups_equal(&reference, &want[0], "the reference");
    }
}
