//! Attention scores of several query vectors (the heads of a KV head, for
//! a few queries) against the same key rows, each key row read once for up
//! to six of them (four rows × six vectors of accumulators need AVX-512VL's
//! 32 registers; with AVX2 alone, two vectors at a time). Two rows per
//! 512-bit register (eight rows × six vectors) was slower: 338 and 343
//! against 351 and 354 tok/s for a 2073-token prefill of the Qwen2.5 1.5B.
//!
//! Every score is [`super::scaled_dots`]'s, bit for bit: the same 8-lane
//! fused multiply-adds over the chunks in order, the same pairwise sum of
//! the lanes, then the scale. Only the loops are interchanged (four keys ×
//! up to six query vectors in registers), so a query's scores do not depend
//! on which other queries share its call.

use super::KvElement;

/// `out[v · stride + j] = scale · (qs[v] · data[starts[j]..starts[j] + d])`
/// for every query vector `v` and `j < starts.len()`, equal bit for bit to
/// [`super::scaled_dots`] of each vector. Panics if the vectors differ in
/// length, `stride < starts.len()`, `out` is too short, or a row runs past
/// `data`.
pub fn scaled_dots_many<T: KvElement>(out: &mut [f32], stride: usize, qs: &[&[f32]], scale: f32, data: &[T], starts: &[usize]) {
    let Some(d) = qs.first().map(|q| q.len()) else { return };
    let n = starts.len();
    assert!(qs.iter().all(|q| q.len() == d), "scaled_dots_many: query vectors of different lengths");
    let needed = (qs.len() - 1).checked_mul(stride).and_then(|last| last.checked_add(n));
    assert!(stride >= n && needed.is_some_and(|needed| out.len() >= needed), "scaled_dots_many: too few outputs");
    assert!(starts.iter().all(|&s| d <= data.len() && s <= data.len() - d), "scaled_dots_many: a row runs past the data");
    #[cfg(target_arch = "x86_64")]
    let v = if super::use_avx2() && d > 0 && d.is_multiple_of(8) && n > 0 {
        // Key rows a block at a time, every vector over a block before the
        // next: the block stays in the L1 while all the vectors read it.
        let block_rows = (KEY_BLOCK_BYTES / (d * std::mem::size_of::<T>())).max(4) / 4 * 4;
        let mut taken = 0;
        for from in (0..n).step_by(block_rows) {
            let rows = &starts[from..(from + block_rows).min(n)];
            // SAFETY: checked above, for all the rows and so for these.
            taken = unsafe { vectors_over(&mut out[from..], stride, qs, d, scale, data, rows) };
        }
        taken
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let v = 0;
    for (i, q) in qs.iter().enumerate().skip(v) {
        super::scaled_dots(&mut out[i * stride..i * stride + n], q, scale, data, starts);
    }
}

/// Bytes of key rows per block of [`scaled_dots_many`] (within the L1).
#[cfg(target_arch = "x86_64")]
const KEY_BLOCK_BYTES: usize = 16 << 10;

/// The vectors of `qs` two or more at a time over the rows `starts` into
/// `out` (vector v's scores at `v · stride`); returns how many it took (all,
/// or all but a last one).
///
/// # Safety
/// The checks of [`scaled_dots_many`] must have passed for these rows and
/// vectors (their outputs lie in `out`); AVX2/FMA/F16C must be available.
#[cfg(target_arch = "x86_64")]
unsafe fn vectors_over<T: KvElement>(out: &mut [f32], stride: usize, qs: &[&[f32]], d: usize, scale: f32, data: &[T], starts: &[usize]) -> usize {
    let wide = avx::six_at_a_time();
    let mut v = 0;
    while qs.len() - v >= 2 {
        // Three at a time where three or five are left (the three heads of
        // each KV head of SmolLM2, say, read each key row once, not twice).
        let take = match (wide, qs.len() - v) {
            (true, left) if left >= 6 => 6,
            (true, 4) => 4,
            (true, 3 | 5) => 3,
            _ => 2,
        };
        let o = out[v * stride..].as_mut_ptr();
        // SAFETY: AVX2/FMA/F16C detected (AVX-512F/VL for six, four, three); `take`
        // vectors of d values from v; their outputs lie in `out` (checked
        // by the caller); every row start..start + d is in `data` (checked).
        unsafe {
            match take {
                6 => avx::dots_six(o, stride, &qs[v..v + 6], d, scale, data.as_ptr(), starts),
                3 => avx::dots_three(o, stride, &qs[v..v + 3], d, scale, data.as_ptr(), starts),
                4 => avx::dots_four(o, stride, &qs[v..v + 4], d, scale, data.as_ptr(), starts),
                _ => avx::dots_two(o, stride, &qs[v..v + 2], d, scale, data.as_ptr(), starts),
            }
        }
        v += take;
    }
    v
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use super::super::scores::avx::sum_each;
    use super::KvElement;
    use std::arch::x86_64::*;

    /// Key rows per block.
    const KEYS: usize = 4;

    /// Whether the CPU has AVX-512F/VL: 32 vector registers, room for six
    /// query vectors' accumulators (24) next to four key chunks.
    pub fn six_at_a_time() -> bool {
        static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *WIDE.get_or_init(|| std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512vl"))
    }

    /// Six query vectors (see [`block`]; 29 of the 32 registers).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    pub unsafe fn dots_six<T: KvElement>(out: *mut f32, stride: usize, qs: &[&[f32]], d: usize, scale: f32, data: *const T, starts: &[usize]) {
        // SAFETY: forwarded.
        unsafe { block::<T, 6>(out, stride, qs, d, scale, data, starts) }
    }

    /// Four query vectors (see [`block`]).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    pub unsafe fn dots_four<T: KvElement>(out: *mut f32, stride: usize, qs: &[&[f32]], d: usize, scale: f32, data: *const T, starts: &[usize]) {
        // SAFETY: forwarded.
        unsafe { block::<T, 4>(out, stride, qs, d, scale, data, starts) }
    }

    /// Three query vectors (see [`block`]; 17 registers).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    pub unsafe fn dots_three<T: KvElement>(out: *mut f32, stride: usize, qs: &[&[f32]], d: usize, scale: f32, data: *const T, starts: &[usize]) {
        // SAFETY: forwarded.
        unsafe { block::<T, 3>(out, stride, qs, d, scale, data, starts) }
    }

    /// Two query vectors (see [`block`]; 13 registers, AVX2 alone).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dots_two<T: KvElement>(out: *mut f32, stride: usize, qs: &[&[f32]], d: usize, scale: f32, data: *const T, starts: &[usize]) {
        // SAFETY: forwarded.
        unsafe { block::<T, 2>(out, stride, qs, d, scale, data, starts) }
    }

    /// `Q` query vectors `qs` of `d` values (a multiple of 8) times every
    /// row, [`KEYS`] rows at a time: each chunk of 8 values of a row is
    /// loaded (and widened) once for all `Q`. A last block of fewer rows
    /// repeats its last row and stores only the real ones. The scores are
    /// reduced two vectors at a time; an odd last vector is reduced next to
    /// a copy of itself (each half of the reduction is one vector's alone).
    ///
    /// # Safety
    /// AVX2/FMA/F16C enabled by the caller; `qs` holds `Q` vectors of `d`
    /// values; `out + v·stride + j` is writable for `v < Q`, `j <
    /// starts.len()`; every row `start..start + d` is readable.
    #[inline(always)]
    unsafe fn block<T: KvElement, const Q: usize>(out: *mut f32, stride: usize, qs: &[&[f32]], d: usize, scale: f32, data: *const T, starts: &[usize]) {
        let n = starts.len();
        let q: [*const f32; Q] = std::array::from_fn(|v| qs[v].as_ptr());
        let mut j = 0;
        // SAFETY (whole body): rows, vectors and outputs as the caller guarantees.
        unsafe {
            let vscale = _mm256_set1_ps(scale);
            while j < n {
                let rows: [*const T; KEYS] = std::array::from_fn(|i| data.add(starts[(j + i).min(n - 1)]));
                let mut acc = [[_mm256_setzero_ps(); KEYS]; Q];
                for c in (0..d).step_by(8) {
                    let mut k = [_mm256_setzero_ps(); KEYS];
                    for (k, row) in k.iter_mut().zip(&rows) {
                        *k = T::load8(row.add(c));
                    }
                    for (a, qv) in acc.iter_mut().zip(&q) {
                        let qv = _mm256_loadu_ps(qv.add(c));
                        for (a, k) in a.iter_mut().zip(&k) {
                            *a = _mm256_fmadd_ps(qv, *k, *a);
                        }
                    }
                }
                let count = (n - j).min(KEYS);
                for p in (0..Q).step_by(2) {
                    let paired = p + 1 < Q;
                    let [a, b] = [acc[p], acc[if paired { p + 1 } else { p }]];
                    // Lanes 0..4: vector p's four scores; 4..8: vector p + 1's
                    // (for an odd last p, a copy of p's, not stored).
                    let scores = _mm256_mul_ps(sum_each([a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]), vscale);
                    let (first, second) = (_mm256_castps256_ps128(scores), _mm256_extractf128_ps::<1>(scores));
                    if count == KEYS {
                        _mm_storeu_ps(out.add(p * stride + j), first);
                        if paired {
                            _mm_storeu_ps(out.add((p + 1) * stride + j), second);
                        }
                    } else {
                        let mut lanes = [0f32; 8];
                        _mm256_storeu_ps(lanes.as_mut_ptr(), scores);
                        for i in 0..count {
                            *out.add(p * stride + j + i) = lanes[i];
                            if paired {
                                *out.add((p + 1) * stride + j + i) = lanes[KEYS + i];
                            }
                        }
                    }
                }
                j += KEYS;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i * 7 + seed) * 37 % 101) as f32 - 50.0) / 13.0).collect()
    }

    /// Every vector count (the six, four, three and two blocks and the
    /// single vector left: 4 takes the four, 5 three and two, 8 to 11 six
    /// and the rest) and row count (whole blocks of four and a partial
    /// last block) against `scaled_dots` of each vector, bit for bit.
    fn check<T: KvElement>(data: &[T], d: usize) {
        for vectors in [1usize, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13] {
            let qs: Vec<Vec<f32>> = (0..vectors).map(|v| values(d, 3 + v)).collect();
            let q_refs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
            // 70 rows: several key blocks (32 rows of 128 f32), the last partial.
            for rows in [1usize, 3, 4, 5, 7, 8, 9, 16, 23, 70] {
                let starts: Vec<usize> = (0..rows).map(|i| (i * 13 % 37) * d).collect();
                let stride = rows + 3;
                let mut got = vec![f32::NAN; vectors * stride];
                scaled_dots_many(&mut got, stride, &q_refs, 0.125, data, &starts);
                for (v, q) in qs.iter().enumerate() {
                    let mut want = vec![f32::NAN; rows];
                    super::super::scaled_dots(&mut want, q, 0.125, data, &starts);
                    let bits = |s: &[f32]| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got[v * stride..v * stride + rows]), bits(&want), "d {d}, {vectors} vectors, {rows} rows, vector {v}");
                    assert!(got[v * stride + rows..(v + 1) * stride].iter().all(|x| x.is_nan()), "nothing written past the rows");
                }
            }
        }
    }

    #[test]
    fn many_vectors_give_the_bits_of_one_at_a_time() {
        for d in [8usize, 64, 128, 12] {
            let wide = values(d * 40, d);
            check(&wide, d);
            let narrow: Vec<half::f16> = wide.iter().map(|&v| half::f16::from_f32(v)).collect();
            check(&narrow, d);
        }
    }

    /// The 256-bit two-vector kernel (what CPUs without AVX-512 take) is
    /// checked directly, since this machine's dispatch may pick the wide one.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx2_kernel_gives_the_same_bits() {
        if !crate::simd::use_avx2() {
            return;
        }
        let d = 64;
        let data = values(d * 40, 5);
        let qs: Vec<Vec<f32>> = (0..2).map(|v| values(d, 11 + v)).collect();
        let q_refs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
        for rows in [1usize, 4, 5, 23] {
            let starts: Vec<usize> = (0..rows).map(|i| (i * 13 % 37) * d).collect();
            let mut got = vec![f32::NAN; 2 * rows];
            // SAFETY: AVX2/FMA/F16C detected; two vectors of d values; 2 × rows outputs; rows inside data.
            unsafe { avx::dots_two(got.as_mut_ptr(), rows, &q_refs, d, 0.25, data.as_ptr(), &starts) };
            for (v, q) in qs.iter().enumerate() {
                let mut want = vec![0f32; rows];
                super::super::scaled_dots(&mut want, q, 0.25, &data, &starts);
                assert_eq!(got[v * rows..(v + 1) * rows].iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "{rows} rows, vector {v}");
            }
        }
    }

    #[test]
    fn a_row_past_the_data_or_short_outputs_panic() {
        let q = [1.0f32; 8];
        let past = std::panic::catch_unwind(|| scaled_dots_many(&mut [0f32; 4], 2, &[&q, &q], 1.0, &[0f32; 12], &[5]));
        assert!(past.is_err());
        let short = std::panic::catch_unwind(|| scaled_dots_many(&mut [0f32; 3], 2, &[&q, &q], 1.0, &[0f32; 16], &[0, 8]));
        assert!(short.is_err());
    }
}
