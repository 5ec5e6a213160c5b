//! AVX-512 VNNI decode kernels for Q4_K and Q6_K: one token against one
//! weight row, 64 values per `vpdpbusd` (four rows: `vnni4`).
//!
//! A super-block's 256 unsigned values are unpacked into four registers of
//! 64 consecutive values, so the token's activations are four plain 64-byte
//! loads (shared by the rows). Each i32 lane then holds the sum of 4 products
//! of one run (32 values for Q4_K, 16 for Q6_K); lanes are multiplied by
//! their run's integer scale and summed, giving exactly the integers of the
//! other kernels (`isum`, Q6_K's offset, the mins' `msum`), folded with the
//! same float operations: results equal the AVX2 and scalar kernels bit for
//! bit.

use super::avx2::{half, hsum_i32};
use super::{scales_mins_k4, Q8KBlock, Q4K_BYTES, Q6K_BYTES};
use std::arch::x86_64::*;

/// Whether this CPU runs these kernels.
pub fn available() -> bool {
    std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512bw")
        && std::is_x86_feature_detected!("avx512vnni")
        && super::avx2::available()
}

/// One K-quant format as seen by these kernels.
trait ZFormat {
    /// Bytes per super-block.
    const BYTES: usize;
    /// Values per integer scale.
    const SUB: usize;
    /// Values `64m..64m + 64` of the super-block, unsigned, for m in 0..4.
    unsafe fn values(wb: *const u8) -> [__m512i; 4];
    /// The run scales as i32 lanes (run `i` in lane `i`), and the mins as
    /// i32 lanes of a 256-bit register (zero without mins).
    unsafe fn scales(wb: *const u8) -> (__m512i, __m256i);
    /// (d, dmin).
    unsafe fn d(wb: *const u8) -> (f32, f32);
    /// Whether the format has mins (else Q6_K's offset of 32).
    const MINS: bool;
}

struct Q4K;
struct Q6K;

impl ZFormat for Q4K {
    const BYTES: usize = Q4K_BYTES;
    const SUB: usize = 32;
    const MINS: bool = true;
    #[inline(always)]
    unsafe fn values(wb: *const u8) -> [__m512i; 4] {
        // SAFETY: bytes 16..144 (the packed nibbles) are readable; AVX-512 is
        // enabled in every caller this is inlined into.
        unsafe {
            let mask = _mm512_set1_epi8(0x0F);
            let half = |at: usize| {
                // Bytes 0..32 of this half hold sub-block 2h (low nibbles) and
                // 2h + 1 (high), bytes 32..64 sub-blocks 2h + 2 and 2h + 3.
                let q = _mm512_loadu_si512(wb.add(16 + at) as *const __m512i);
                let lo = _mm512_and_si512(q, mask);
                let hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), mask);
                (_mm512_shuffle_i64x2(lo, hi, 0b01_00_01_00), _mm512_shuffle_i64x2(lo, hi, 0b11_10_11_10))
            };
            let (a, b) = half(0);
            let (c, d) = half(64);
            [a, b, c, d]
        }
    }
    #[inline(always)]
    unsafe fn scales(wb: *const u8) -> (__m512i, __m256i) {
        // SAFETY: bytes 4..16 (the packed scales and mins) are readable.
        let packed = unsafe { &*(wb.add(4) as *const [u8; 12]) };
        let (sc, mins) = scales_mins_k4(packed);
        // SAFETY: AVX-512/AVX2 enabled in every caller.
        unsafe {
            let sc = _mm512_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(sc)));
            let mins = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(mins)));
            (sc, mins)
        }
    }
    #[inline(always)]
    unsafe fn d(wb: *const u8) -> (f32, f32) {
        // SAFETY: bytes 0..4 are readable; F16C enabled in every caller.
        unsafe { (half(wb), half(wb.add(2))) }
    }
}

impl ZFormat for Q6K {
    const BYTES: usize = Q6K_BYTES;
    const SUB: usize = 16;
    const MINS: bool = false;
    #[inline(always)]
    unsafe fn values(wb: *const u8) -> [__m512i; 4] {
        // SAFETY: bytes 0..192 (ql, qh) are readable; AVX-512 enabled in every caller.
        unsafe {
            let mask = _mm512_set1_epi8(0x0F);
            let three = _mm512_set1_epi8(3);
            // Per 128-bit word: shift qh by 0 (low 256 bits) or 2 (high), and by 4 or 6.
            let shift_a = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);
            let shift_b = _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4);
            let half = |n: usize| {
                // ql[64n..64n + 64]: low nibbles are values 128n..128n + 64,
                // high nibbles 128n + 64..128n + 128; qh[32n..32n + 32] holds
                // their two high bits at 0/2 (first 64) and 4/6 (next 64).
                let ql = _mm512_loadu_si512(wb.add(64 * n) as *const __m512i);
                let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(wb.add(128 + 32 * n) as *const __m256i));
                let ha = _mm512_and_si512(_mm512_srlv_epi64(qh, shift_a), three);
                let hb = _mm512_and_si512(_mm512_srlv_epi64(qh, shift_b), three);
                let a = _mm512_or_si512(_mm512_and_si512(ql, mask), _mm512_slli_epi16(ha, 4));
                let b = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), mask), _mm512_slli_epi16(hb, 4));
                (a, b)
            };
            let (a, b) = half(0);
            let (c, d) = half(1);
            [a, b, c, d]
        }
    }
    #[inline(always)]
    unsafe fn scales(wb: *const u8) -> (__m512i, __m256i) {
        // SAFETY: bytes 192..208 (16 signed scales) are readable; AVX-512 enabled.
        unsafe { (_mm512_cvtepi8_epi32(_mm_loadu_si128(wb.add(192) as *const __m128i)), _mm256_setzero_si256()) }
    }
    #[inline(always)]
    unsafe fn d(wb: *const u8) -> (f32, f32) {
        // SAFETY: bytes 208..210 are readable; F16C enabled.
        unsafe { (half(wb.add(208)), 0.0) }
    }
}

/// The run of each lane of register `m` (values `64m + 4l..`): `(64m + 4l) / SUB`.
#[inline(always)]
unsafe fn run_index<F: ZFormat>(m: usize) -> __m512i {
    let idx: [i32; 16] = std::array::from_fn(|l| ((64 * m + 4 * l) / F::SUB) as i32);
    // SAFETY: AVX-512 enabled in every caller; idx is 64 readable bytes.
    unsafe { _mm512_loadu_si512(idx.as_ptr() as *const __m512i) }
}

/// A token's super-block as these kernels read it: the four 64-value
/// registers, the 16 sums of 16 (as i32 lanes) and the 8 pair sums.
struct Token {
    q: [__m512i; 4],
    bsums: __m512i,
    pairs: __m256i,
    d: f32,
}

#[inline(always)]
unsafe fn token(xb: &Q8KBlock) -> Token {
    // SAFETY: xb.qs holds 256 bytes, xb.bsums 16 i16; AVX-512/AVX2 enabled in every caller.
    unsafe {
        let q = std::array::from_fn(|m| _mm512_loadu_si512(xb.qs.as_ptr().add(64 * m) as *const __m512i));
        let sums = _mm256_loadu_si256(xb.bsums.as_ptr() as *const __m256i);
        Token { q, bsums: _mm512_cvtepi16_epi32(sums), pairs: _mm256_madd_epi16(sums, _mm256_set1_epi16(1)), d: xb.d }
    }
}

/// One row's super-block against one token: folds into `acc` exactly as the
/// other kernels do (`fma(d_x·d, isum, acc)`, then the mins).
#[inline(always)]
unsafe fn block<F: ZFormat>(wb: *const u8, x: &Token, idx: &[__m512i; 4], acc: f32) -> f32 {
    // SAFETY: wb is a whole super-block (callers slice it); AVX-512 enabled.
    unsafe {
        let u = F::values(wb);
        let (sc, mins) = F::scales(wb);
        let mut tot = _mm512_setzero_si512();
        for m in 0..4 {
            let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[m], x.q[m]);
            tot = _mm512_add_epi32(tot, _mm512_mullo_epi32(dot, _mm512_permutexvar_epi32(idx[m], sc)));
        }
        if !F::MINS {
            // Q6_K stores values + 32: subtract 32 · Σ_g sc_g · bsum_g.
            tot = _mm512_sub_epi32(tot, _mm512_slli_epi32(_mm512_mullo_epi32(sc, x.bsums), 5));
        }
        let isum = _mm512_reduce_add_epi32(tot);
        let d = F::d(wb);
        let acc = (x.d * d.0).mul_add(isum as f32, acc);
        if F::MINS {
            let msum = hsum_i32(_mm256_mullo_epi32(mins, x.pairs));
            (-(x.d * d.1)).mul_add(msum as f32, acc)
        } else {
            acc
        }
    }
}

/// `R` weight rows against one token, `n` super-blocks, prefetching the
/// same offsets of the next `R` rows (as the AVX2 decode kernel does).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn rows_one_token<F: ZFormat, const R: usize>(w: [&[u8]; R], x: &[Q8KBlock], n: usize) -> [f32; R] {
    let mut acc = [0f32; R];
    let row_len = w[0].len();
    let ahead = w[R - 1].as_ptr().wrapping_add(row_len);
    // SAFETY: AVX-512 enabled by this function's target features.
    let idx: [__m512i; 4] = std::array::from_fn(|m| unsafe { run_index::<F>(m) });
    for (b, xb) in x.iter().enumerate().take(n) {
        // SAFETY: as above.
        let t = unsafe { token(xb) };
        for r in 0..R {
            let next = ahead.wrapping_add(r * row_len + b * F::BYTES);
            for line in (0..F::BYTES + 63).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(line) as *const i8);
            }
            let wb = &w[r][b * F::BYTES..(b + 1) * F::BYTES];
            // SAFETY: wb is one whole super-block (bounds-checked slice).
            acc[r] = unsafe { block::<F>(wb.as_ptr(), &t, &idx, acc[r]) };
        }
    }
    acc
}

macro_rules! entries {
    ($one:ident, $fmt:ty) => {
        /// One row · one token.
        pub fn $one(w: &[u8], x: &[Q8KBlock]) -> f32 {
            let n = x.len().min(w.len() / <$fmt>::BYTES);
            // SAFETY: chosen only where `available()` holds.
            unsafe { rows_one_token::<$fmt, 1>([w], x, n)[0] }
        }
    };
}
entries!(dot_q4_k, Q4K);
entries!(dot_q6_k, Q6K);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::types::GgmlType;
    use crate::quant::kquant::{quantize_row_q8k, scalar_kdot_kernels};

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    #[test]
    #[cfg_attr(not(host_avx512vnni), ignore = "needs a CPU with AVX-512 VNNI")]
    fn vnni_decode_equals_the_scalar_kernels_bit_for_bit() {
        use super::super::vnni4::{rows4_q4_k, rows4_q6_k};
        assert!(super::super::vnni4::available(), "built on a CPU with AVX-512 VNNI, run on one without");
        let mut seed = 7u64;
        let nb = 5;
        for (dtype, one, rows4) in [(GgmlType::Q4K, dot_q4_k as fn(&[u8], &[Q8KBlock]) -> f32, rows4_q4_k as fn([&[u8]; 4], &[Q8KBlock]) -> [f32; 4]), (GgmlType::Q6K, dot_q6_k, rows4_q6_k)] {
            let ts = dtype.type_size();
            let scalar = scalar_kdot_kernels(dtype).expect("scalar kernels").one;
            for _ in 0..20 {
                let x: Vec<f32> = (0..nb * 256).map(|_| (lcg(&mut seed) % 4001) as f32 / 800.0 - 2.5).collect();
                let mut xq = vec![Q8KBlock::default(); nb];
                quantize_row_q8k(&x, &mut xq);
                let rows: Vec<Vec<u8>> = (0..4)
                    .map(|_| {
                        let mut w: Vec<u8> = (0..nb * ts).map(|_| lcg(&mut seed) as u8).collect();
                        for b in w.chunks_exact_mut(ts) {
                            let d = half::f16::from_f32(0.001 + (lcg(&mut seed) % 50) as f32 / 10000.0).to_bits().to_le_bytes();
                            let at = if dtype == GgmlType::Q6K { 208 } else { 0 };
                            b[at..at + 2].copy_from_slice(&d);
                            if dtype == GgmlType::Q4K {
                                b[2..4].copy_from_slice(&half::f16::from_f32(0.002).to_bits().to_le_bytes());
                            }
                        }
                        w
                    })
                    .collect();
                let four = rows4([&rows[0], &rows[1], &rows[2], &rows[3]], &xq);
                for (r, row) in rows.iter().enumerate() {
                    let want = scalar(row, &xq).to_bits();
                    assert_eq!(one(row, &xq).to_bits(), want, "{dtype:?} one row {r}");
                    assert_eq!(four[r].to_bits(), want, "{dtype:?} four rows, row {r}");
                }
            }
        }
    }
}
