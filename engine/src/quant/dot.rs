//! Activation quantization to 8-bit blocks and the integer dot products that
//! multiply them with 4- and 8-bit weight blocks (Q4_0, Q4_1, Q8_0).
//!
//! This is how the CPU backend keeps weights quantized: a row of activations
//! is quantized once per matmul to [`Q8Block`]s (32 values, one f32 scale, and
//! the scaled sum needed by formats with an offset), and each weight row is
//! dotted with it using 8-bit integer multiply-adds. AVX2 kernels are chosen at
//! run time; a scalar fallback gives the same result on any CPU.

use crate::gguf::types::GgmlType;

/// Elements per quantization block.
pub const QK: usize = 32;

/// 32 activations quantized to i8 with one scale (`d`) and `s = d * sum(qs)`.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(8))]
pub struct Q8Block {
    /// Scale: value = d * q.
    pub d: f32,
    /// `d * Σq` (used by Q4_0 / Q4_1 offsets; the quantized sum, not the exact
    /// one, so its rounding error cancels against the product term's).
    pub s: f32,
    /// The quantized values.
    pub qs: [i8; QK],
}

/// Quantize `x` (a multiple of 32 long) into `out` (x.len() / 32 blocks).
pub fn quantize_row_q8(x: &[f32], out: &mut [Q8Block]) {
    for (chunk, block) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, v) in block.qs.iter_mut().zip(chunk) {
            let r = ((v * inv).round() as i32).clamp(-127, 127);
            *q = r as i8;
            sum += r;
        }
        block.d = d;
        block.s = d * sum as f32;
    }
}

/// A dot product of one weight row (raw GGUF block bytes) with quantized activations.
pub type DotFn = fn(&[u8], &[Q8Block]) -> f32;

/// The fastest available dot kernel for a weight type, or `None` when the
/// type has no integer kernel (the caller then dequantizes rows instead).
pub fn dot_kernel(dtype: GgmlType) -> Option<DotFn> {
    let avx2 = has_avx2();
    match dtype {
        GgmlType::Q4_0 => Some(if avx2 { avx2::dot_q4_0 } else { scalar::dot_q4_0 }),
        GgmlType::Q4_1 => Some(if avx2 { avx2::dot_q4_1 } else { scalar::dot_q4_1 }),
        GgmlType::Q8_0 => Some(if avx2 { avx2::dot_q8_0 } else { scalar::dot_q8_0 }),
        _ => None,
    }
}

/// The scalar kernel for a type (for tests and CPUs without AVX2).
pub fn scalar_dot_kernel(dtype: GgmlType) -> Option<DotFn> {
    match dtype {
        GgmlType::Q4_0 => Some(scalar::dot_q4_0),
        GgmlType::Q4_1 => Some(scalar::dot_q4_1),
        GgmlType::Q8_0 => Some(scalar::dot_q8_0),
        _ => None,
    }
}

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// Portable reference kernels.
mod scalar {
    use super::{f16_at, Q8Block};

    pub fn dot_q4_0(w: &[u8], x: &[Q8Block]) -> f32 {
        let mut sum = 0f32;
        for (wb, xb) in w.chunks_exact(18).zip(x) {
            let d = f16_at(wb, 0);
            let mut isum = 0i32;
            for j in 0..16 {
                let byte = wb[2 + j];
                isum += (byte & 0x0F) as i32 * xb.qs[j] as i32;
                isum += (byte >> 4) as i32 * xb.qs[j + 16] as i32;
            }
            sum += d * (xb.d * isum as f32 - 8.0 * xb.s);
        }
        sum
    }

    pub fn dot_q4_1(w: &[u8], x: &[Q8Block]) -> f32 {
        let mut sum = 0f32;
        for (wb, xb) in w.chunks_exact(20).zip(x) {
            let d = f16_at(wb, 0);
            let m = f16_at(wb, 2);
            let mut isum = 0i32;
            for j in 0..16 {
                let byte = wb[4 + j];
                isum += (byte & 0x0F) as i32 * xb.qs[j] as i32;
                isum += (byte >> 4) as i32 * xb.qs[j + 16] as i32;
            }
            sum += d * xb.d * isum as f32 + m * xb.s;
        }
        sum
    }

    pub fn dot_q8_0(w: &[u8], x: &[Q8Block]) -> f32 {
        let mut sum = 0f32;
        for (wb, xb) in w.chunks_exact(34).zip(x) {
            let d = f16_at(wb, 0);
            let mut isum = 0i32;
            for j in 0..32 {
                isum += (wb[2 + j] as i8) as i32 * xb.qs[j] as i32;
            }
            sum += d * xb.d * isum as f32;
        }
        sum
    }
}

/// AVX2 + FMA + F16C kernels (selected at run time).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::Q8Block;
    use std::arch::x86_64::*;

    pub fn dot_q4_0(w: &[u8], x: &[Q8Block]) -> f32 {
        let n = x.len().min(w.len() / 18);
        // SAFETY: only selected when avx2/fma/f16c were detected; `n` bounds every block read.
        unsafe { q4_0(w.as_ptr(), x.as_ptr(), n) }
    }

    pub fn dot_q4_1(w: &[u8], x: &[Q8Block]) -> f32 {
        let n = x.len().min(w.len() / 20);
        // SAFETY: as above.
        unsafe { q4_1(w.as_ptr(), x.as_ptr(), n) }
    }

    pub fn dot_q8_0(w: &[u8], x: &[Q8Block]) -> f32 {
        let n = x.len().min(w.len() / 34);
        // SAFETY: as above.
        unsafe { q8_0(w.as_ptr(), x.as_ptr(), n) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn half(p: *const u8) -> f32 {
        // SAFETY: the caller guarantees two readable bytes at p.
        let bits = unsafe { std::ptr::read_unaligned(p as *const u16) };
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// 16 packed nibble bytes -> 32 unsigned bytes (low nibbles first).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_nibbles(p: *const u8) -> __m256i {
        // SAFETY: the caller guarantees 16 readable bytes at p.
        let q = unsafe { _mm_loadu_si128(p as *const __m128i) };
        let mask = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(q, mask);
        let hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
        _mm256_set_m128i(hi, lo)
    }

    /// Sum over 32 lanes of unsigned(a) * signed(b), as 8 f32 partial sums.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn mul_sum_us8(a: __m256i, b: __m256i) -> __m256 {
        let p16 = _mm256_maddubs_epi16(a, b);
        _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_1(w: *const u8, x: *const Q8Block, n: usize) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let mut offs = 0f32;
        for b in 0..n {
            // SAFETY: b < n blocks of 20 bytes in w and n Q8Blocks in x.
            unsafe {
                let wb = w.add(b * 20);
                let xb = &*x.add(b);
                let q4 = unpack_nibbles(wb.add(4));
                let q8 = _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
                let scale = _mm256_set1_ps(half(wb) * xb.d);
                acc = _mm256_fmadd_ps(scale, mul_sum_us8(q4, q8), acc);
                offs += half(wb.add(2)) * xb.s;
            }
        }
        // SAFETY: features enabled on this function.
        unsafe { hsum(acc) + offs }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_0(w: *const u8, x: *const Q8Block, n: usize) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let mut offs = 0f32;
        for b in 0..n {
            // SAFETY: b < n blocks of 18 bytes in w and n Q8Blocks in x.
            unsafe {
                let wb = w.add(b * 18);
                let xb = &*x.add(b);
                let d = half(wb);
                let q4 = unpack_nibbles(wb.add(2));
                let q8 = _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), mul_sum_us8(q4, q8), acc);
                offs += d * xb.s;
            }
        }
        // SAFETY: features enabled on this function.
        unsafe { hsum(acc) - 8.0 * offs }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q8_0(w: *const u8, x: *const Q8Block, n: usize) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for b in 0..n {
            // SAFETY: b < n blocks of 34 bytes in w and n Q8Blocks in x.
            unsafe {
                let wb = w.add(b * 34);
                let xb = &*x.add(b);
                let qw = _mm256_loadu_si256(wb.add(2) as *const __m256i);
                let qx = _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
                let abs_w = _mm256_sign_epi8(qw, qw);
                let signed_x = _mm256_sign_epi8(qx, qw);
                let scale = _mm256_set1_ps(half(wb) * xb.d);
                acc = _mm256_fmadd_ps(scale, mul_sum_us8(abs_w, signed_x), acc);
            }
        }
        // SAFETY: features enabled on this function.
        unsafe { hsum(acc) }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod avx2 {
    pub use super::scalar::{dot_q4_0, dot_q4_1, dot_q8_0};
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    fn random_blocks(dtype: GgmlType, nblocks: usize, seed: &mut u64) -> Vec<u8> {
        let ts = dtype.type_size();
        let mut out = vec![0u8; nblocks * ts];
        for b in out.chunks_exact_mut(ts) {
            for byte in b.iter_mut() {
                *byte = lcg(seed) as u8;
            }
            let scale = half::f16::from_f32(0.01 + (lcg(seed) % 100) as f32 / 1000.0).to_bits();
            b[0..2].copy_from_slice(&scale.to_le_bytes());
            if dtype == GgmlType::Q4_1 {
                let min = half::f16::from_f32(-0.05).to_bits();
                b[2..4].copy_from_slice(&min.to_le_bytes());
            }
        }
        out
    }

    fn dequant(dtype: GgmlType, w: &[u8]) -> Vec<f32> {
        let mut out = Vec::new();
        for b in w.chunks_exact(dtype.type_size()) {
            let d = f16_at(b, 0);
            match dtype {
                GgmlType::Q4_0 => {
                    let vals: Vec<f32> = (0..32)
                        .map(|j| {
                            let byte = b[2 + j % 16];
                            let q = if j < 16 { byte & 15 } else { byte >> 4 };
                            (q as f32 - 8.0) * d
                        })
                        .collect();
                    out.extend(vals);
                }
                GgmlType::Q4_1 => {
                    let m = f16_at(b, 2);
                    out.extend((0..32).map(|j| {
                        let byte = b[4 + j % 16];
                        let q = if j < 16 { byte & 15 } else { byte >> 4 };
                        q as f32 * d + m
                    }));
                }
                _ => out.extend((0..32).map(|j| (b[2 + j] as i8) as f32 * d)),
            }
        }
        out
    }

    #[test]
    fn kernels_match_dequantized_dot() {
        let mut seed = 7u64;
        let n = 576;
        let x: Vec<f32> = (0..n).map(|_| (lcg(&mut seed) % 2000) as f32 / 1000.0 - 1.0).collect();
        let mut xq = vec![Q8Block::default(); n / QK];
        quantize_row_q8(&x, &mut xq);
        for dtype in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            let w = random_blocks(dtype, n / QK, &mut seed);
            let wf = dequant(dtype, &w);
            let exact: f32 = wf.iter().zip(&x).map(|(a, b)| a * b).sum();
            let magnitude: f32 = wf.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
            let fast = dot_kernel(dtype).map(|k| k(&w, &xq));
            let slow = scalar_dot_kernel(dtype).map(|k| k(&w, &xq));
            let (Some(fast), Some(slow)) = (fast, slow) else { panic!("no kernel for {dtype:?}") };
            assert!((fast - slow).abs() <= 1e-3 * slow.abs().max(1.0), "{dtype:?}: {fast} vs {slow}");
            // 8-bit activations: the error is a small fraction of the summed magnitudes.
            assert!((slow - exact).abs() <= 1e-2 * magnitude, "{dtype:?}: {slow} vs {exact} (magnitude {magnitude})");
        }
    }

    #[test]
    fn quantize_round_trips_within_half_a_step() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) * 0.37).collect();
        let mut q = vec![Q8Block::default(); 2];
        quantize_row_q8(&x, &mut q);
        for (i, v) in x.iter().enumerate() {
            let b = &q[i / 32];
            assert!((b.qs[i % 32] as f32 * b.d - v).abs() <= b.d * 0.5 + 1e-6);
        }
        let zero = vec![0f32; 32];
        quantize_row_q8(&zero, &mut q[..1]);
        assert_eq!(q[0].d, 0.0);
    }
}
