//! AVX2 kernels: `vpmaddubsw` (unsigned weights · signed activations, i16
//! pairs that cannot saturate: |u| ≤ 63, |q| ≤ 127) then `vpmaddwd` by the
//! sub-block scale, summed exactly in i32 lanes.
//!
//! One token streams each super-block straight from memory (decode: four rows
//! at a time for independent chains); four tokens unpack a super-block once
//! into registers and reuse it.

use super::*;
use std::arch::x86_64::*;

pub fn available() -> bool {
    std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
        && std::is_x86_feature_detected!("f16c")
}

/// One K-quant format: its super-block size and how a super-block's
/// unsigned values, scales and float scales are read.
pub(super) trait Format {
    /// Bytes per super-block.
    const BYTES: usize;
    /// Values per integer scale (32 for Q4_K/Q5_K, 16 for Q6_K).
    const SUB: usize;
    /// Whether the format has sub-block mins (Q4_K, Q5_K).
    const MINS: bool;
    /// The i16 scale pair of each of the 8 registers of 32 values, and the mins.
    unsafe fn scales(wb: *const u8) -> ([__m256i; 8], [u8; 8]);
    /// Register `k` (values 32k..32k+32) of the unsigned weights.
    unsafe fn values(wb: *const u8, k: usize) -> __m256i;
    /// (d, dmin).
    unsafe fn d(wb: *const u8) -> (f32, f32);
    /// The integer term subtracted from Σ sc·u·q (Q6_K's offset).
    fn offset(wb: &[u8], xb: &Q8KBlock) -> i32;
    /// The integer scale of each run of `SUB` values, and the mins (zero for Q6_K).
    fn int_scales(wb: &[u8]) -> ([i32; 16], [u8; 8]);
}

/// Q4_K.
pub(super) struct Q4K;
/// Q5_K.
pub(super) struct Q5K;
/// Q6_K.
pub(super) struct Q6K;

/// The 8 integer run scales (as i32, the rest zero) and the 8 mins of a
/// Q4_K/Q5_K super-block. Inlined: as a call it cost a `vzeroupper` and a
/// store-forwarding stall on every super-block of the kernels that use it.
#[inline(always)]
fn k4_int_scales(wb: &[u8]) -> ([i32; 16], [u8; 8]) {
    let (sc, mins) = scales_mins_k4(&wb[4..16]);
    let mut out = [0i32; 16];
    for (o, s) in out.iter_mut().zip(sc) {
        *o = s as i32;
    }
    (out, mins)
}

#[inline(always)]
pub(super) unsafe fn half(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees two readable bytes at p; F16C is checked by `available`.
    unsafe {
        let bits = std::ptr::read_unaligned(p as *const u16);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }
}

#[inline(always)]
unsafe fn k4_scales(wb: *const u8) -> ([__m256i; 8], [u8; 8]) {
    // SAFETY: the caller guarantees a whole Q4_K/Q5_K super-block at wb.
    let packed: &[u8; 12] = unsafe { &*(wb.add(4) as *const [u8; 12]) };
    let (sc, mins) = scales_mins_k4(packed);
    let mut out = [unsafe { _mm256_setzero_si256() }; 8];
    for (o, s) in out.iter_mut().zip(sc) {
        // SAFETY: AVX2 is enabled in every caller this is inlined into.
        *o = unsafe { _mm256_set1_epi16(s as i16) };
    }
    (out, mins)
}

impl Format for Q4K {
    const BYTES: usize = Q4K_BYTES;
    const SUB: usize = 32;
    #[inline(always)]
    fn int_scales(wb: &[u8]) -> ([i32; 16], [u8; 8]) {
        k4_int_scales(wb)
    }
    const MINS: bool = true;
    #[inline(always)]
    unsafe fn scales(wb: *const u8) -> ([__m256i; 8], [u8; 8]) {
        // SAFETY: forwarded.
        unsafe { k4_scales(wb) }
    }
    #[inline(always)]
    unsafe fn values(wb: *const u8, k: usize) -> __m256i {
        // SAFETY: bytes 16..144 of the super-block are readable.
        unsafe {
            let q = _mm256_loadu_si256(wb.add(16 + 32 * (k / 2)) as *const __m256i);
            let q = if k.is_multiple_of(2) { q } else { _mm256_srli_epi16(q, 4) };
            _mm256_and_si256(q, _mm256_set1_epi8(0x0F))
        }
    }
    #[inline(always)]
    unsafe fn d(wb: *const u8) -> (f32, f32) {
        // SAFETY: forwarded.
        unsafe { (half(wb), half(wb.add(2))) }
    }
    fn offset(_: &[u8], _: &Q8KBlock) -> i32 {
        0
    }
}

impl Format for Q5K {
    const BYTES: usize = Q5K_BYTES;
    const SUB: usize = 32;
    #[inline(always)]
    fn int_scales(wb: &[u8]) -> ([i32; 16], [u8; 8]) {
        k4_int_scales(wb)
    }
    const MINS: bool = true;
    #[inline(always)]
    unsafe fn scales(wb: *const u8) -> ([__m256i; 8], [u8; 8]) {
        // SAFETY: forwarded.
        unsafe { k4_scales(wb) }
    }
    #[inline(always)]
    unsafe fn values(wb: *const u8, k: usize) -> __m256i {
        // SAFETY: bytes 16..176 of the super-block are readable.
        unsafe {
            let q = _mm256_loadu_si256(wb.add(48 + 32 * (k / 2)) as *const __m256i);
            let q = if k.is_multiple_of(2) { q } else { _mm256_srli_epi16(q, 4) };
            let qh = _mm256_loadu_si256(wb.add(16) as *const __m256i);
            let h = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(k as i32)), _mm256_set1_epi8(1));
            _mm256_or_si256(_mm256_and_si256(q, _mm256_set1_epi8(0x0F)), _mm256_slli_epi16(h, 4))
        }
    }
    #[inline(always)]
    unsafe fn d(wb: *const u8) -> (f32, f32) {
        // SAFETY: forwarded.
        unsafe { (half(wb), half(wb.add(2))) }
    }
    fn offset(_: &[u8], _: &Q8KBlock) -> i32 {
        0
    }
}

impl Format for Q6K {
    const BYTES: usize = Q6K_BYTES;
    const SUB: usize = 16;
    #[inline(always)]
    fn int_scales(wb: &[u8]) -> ([i32; 16], [u8; 8]) {
        let mut out = [0i32; 16];
        for (o, &s) in out.iter_mut().zip(&wb[192..208]) {
            *o = (s as i8) as i32;
        }
        (out, [0; 8])
    }
    const MINS: bool = false;
    #[inline(always)]
    unsafe fn scales(wb: *const u8) -> ([__m256i; 8], [u8; 8]) {
        // SAFETY: bytes 192..208 (the 16 signed scales) are readable.
        let s = unsafe { &*(wb.add(192) as *const [i8; 16]) };
        // SAFETY (both blocks): AVX2 is enabled in every caller this is inlined into.
        let mut pairs = [unsafe { _mm256_setzero_si256() }; 8];
        for (k, pair) in pairs.iter_mut().enumerate() {
            let (lo, hi) = (s[2 * k] as i16, s[2 * k + 1] as i16);
            *pair = unsafe { _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo)) };
        }
        (pairs, [0; 8])
    }
    #[inline(always)]
    unsafe fn values(wb: *const u8, k: usize) -> __m256i {
        // Register k = 4n + j: the low (j < 2) or high (j >= 2) nibbles of
        // ql[64n + 32(j % 2)..], and two high bits from qh[32n..] at bit 2j.
        let (n, j) = (k / 4, k % 4);
        // SAFETY: bytes 0..192 of the super-block are readable.
        unsafe {
            let ql = _mm256_loadu_si256(wb.add(64 * n + 32 * (j % 2)) as *const __m256i);
            let ql = if j < 2 { ql } else { _mm256_srli_epi16(ql, 4) };
            let qh = _mm256_loadu_si256(wb.add(128 + 32 * n) as *const __m256i);
            let h = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32)), _mm256_set1_epi8(3));
            _mm256_or_si256(_mm256_and_si256(ql, _mm256_set1_epi8(0x0F)), _mm256_slli_epi16(h, 4))
        }
    }
    #[inline(always)]
    unsafe fn d(wb: *const u8) -> (f32, f32) {
        // SAFETY: forwarded.
        unsafe { (half(wb.add(208)), 0.0) }
    }
    fn offset(wb: &[u8], xb: &Q8KBlock) -> i32 {
        q6_offset(&wb[192..208], xb)
    }
}

#[inline(always)]
pub(super) unsafe fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: AVX2 is enabled in every caller.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }
}

/// `Σ_k scales[k] · Σ u·q` over register `k`'s 32 values.
#[inline(always)]
unsafe fn scaled_term(u: __m256i, xb: &Q8KBlock, k: usize, scale: __m256i) -> __m256i {
    // SAFETY: xb.qs holds 256 bytes, k < 8.
    unsafe {
        let q = _mm256_loadu_si256(xb.qs.as_ptr().add(32 * k) as *const __m256i);
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), scale)
    }
}

/// Fold one super-block's integers into a row's accumulator (the scalar order).
#[inline(always)]
fn fold<F: Format>(acc: f32, xb: &Q8KBlock, d: (f32, f32), isum: i32, mins: &[u8; 8]) -> f32 {
    let acc = (xb.d * d.0).mul_add(isum as f32, acc);
    if F::MINS {
        (-(xb.d * d.1)).mul_add(min_sum(mins, xb) as f32, acc)
    } else {
        acc
    }
}

/// `R` weight rows against one token, streaming each super-block.
///
/// Rows of a matrix lie one after another, so while these rows are read
/// the same offsets of the next `R` rows are prefetched (a hint only: the
/// address is never dereferenced, and hardware prefetchers stop at page
/// boundaries, which K-quant rows cross every few super-blocks).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_one_token<F: Format, const R: usize>(w: [&[u8]; R], x: &[Q8KBlock], n: usize) -> [f32; R] {
    let mut acc = [0f32; R];
    let row_len = w[0].len();
    let ahead = w[R - 1].as_ptr().wrapping_add(row_len);
    for (b, xb) in x.iter().enumerate().take(n) {
        for r in 0..R {
            let next = ahead.wrapping_add(r * row_len + b * F::BYTES);
            for line in (0..F::BYTES + 63).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(line) as *const i8);
            }
            let wb = &w[r][b * F::BYTES..(b + 1) * F::BYTES];
            // SAFETY: wb is one whole super-block (bounds-checked slice).
            unsafe {
                let p = wb.as_ptr();
                let (scales, mins) = F::scales(p);
                let mut sum = _mm256_setzero_si256();
                for (k, scale) in scales.iter().enumerate() {
                    sum = _mm256_add_epi32(sum, scaled_term(F::values(p, k), xb, k, *scale));
                }
                let isum = hsum_i32(sum) - F::offset(wb, xb);
                acc[r] = fold::<F>(acc[r], xb, F::d(p), isum, &mins);
            }
        }
    }
    acc
}

/// One weight row against `R` tokens `stride` blocks apart, unpacking each
/// super-block once.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_tokens<F: Format, const R: usize>(w: &[u8], x: &[Q8KBlock], stride: usize, n: usize) -> [f32; R] {
    let mut acc = [0f32; R];
    for b in 0..n {
        let wb = &w[b * F::BYTES..(b + 1) * F::BYTES];
        // SAFETY: wb is one whole super-block (bounds-checked slice).
        unsafe {
            let p = wb.as_ptr();
            let (scales, mins) = F::scales(p);
            let u: [__m256i; 8] = std::array::from_fn(|k| F::values(p, k));
            let d = F::d(p);
            for (j, acc) in acc.iter_mut().enumerate() {
                let xb = &x[j * stride + b];
                let mut sum = _mm256_setzero_si256();
                for k in 0..8 {
                    sum = _mm256_add_epi32(sum, scaled_term(u[k], xb, k, scales[k]));
                }
                let isum = hsum_i32(sum) - F::offset(wb, xb);
                *acc = fold::<F>(*acc, xb, d, isum, &mins);
            }
        }
    }
    acc
}

macro_rules! entries {
    ($one:ident, $four:ident, $rows4:ident, $fmt:ty) => {
        pub fn $one(w: &[u8], x: &[Q8KBlock]) -> f32 {
            let n = x.len().min(w.len() / <$fmt>::BYTES);
            // SAFETY: chosen only when AVX2/FMA/F16C were detected (`available`).
            unsafe { rows_one_token::<$fmt, 1>([w], x, n)[0] }
        }

        pub fn $rows4(w: [&[u8]; 4], x: &[Q8KBlock]) -> [f32; 4] {
            let n = w.iter().fold(x.len(), |n, r| n.min(r.len() / <$fmt>::BYTES));
            // SAFETY: as above.
            unsafe { rows_one_token::<$fmt, 4>(w, x, n) }
        }

        pub fn $four(w: &[u8], x: &[Q8KBlock], stride: usize) -> [f32; 4] {
            let n = stride.min(w.len() / <$fmt>::BYTES);
            assert!(x.len() >= 3 * stride + n, "dot4: activation rows too short");
            // SAFETY: as above; slices bound every read.
            unsafe { row_tokens::<$fmt, 4>(w, x, stride, n) }
        }
    };
}
entries!(dot_q4_k, dot4_q4_k, rows4_q4_k, Q4K);
entries!(dot_q5_k, dot4_q5_k, rows4_q5_k, Q5K);
entries!(dot_q6_k, dot4_q6_k, rows4_q6_k, Q6K);
