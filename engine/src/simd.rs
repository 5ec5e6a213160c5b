//! f32 vector primitives (dot product, scaled add, attention's row sums)
//! with an AVX2/FMA/F16C path chosen at run time and a portable fallback.

use std::sync::OnceLock;

mod element;
#[cfg(target_arch = "x86_64")]
mod rows_wide;
mod scores;
mod scores_many;
#[cfg(target_arch = "x86_64")]
mod transpose;
pub use element::{narrow_to_f16, KvElement};
pub use scores::scaled_dots;
pub use scores_many::scaled_dots_many;
#[cfg(target_arch = "x86_64")]
pub use transpose::transpose16;

/// Whether the CPU has AVX2, FMA and F16C (checked once).
pub(crate) fn use_avx2() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Whether the CPU has AVX-512F as well as [`use_avx2`]'s features (checked once).
#[cfg(target_arch = "x86_64")]
pub(crate) fn use_avx512() -> bool {
    rows_wide::available()
}

/// Dot product of two equal-length slices (extra elements of the longer are ignored).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: AVX2 and FMA were detected; both slices have at least n elements.
        return unsafe { avx::dot(a.as_ptr(), b.as_ptr(), n) };
    }
    dot_portable(&a[..n], &b[..n])
}

/// `acc[i] += alpha * x[i]`.
#[inline]
pub fn axpy(acc: &mut [f32], alpha: f32, x: &[f32]) {
    let n = acc.len().min(x.len());
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: AVX2 and FMA were detected; both slices have at least n elements.
        unsafe { avx::axpy(acc.as_mut_ptr(), alpha, x.as_ptr(), n) };
        return;
    }
    for (a, v) in acc[..n].iter_mut().zip(&x[..n]) {
        *a += alpha * v;
    }
}

/// `out[j] = Σ_i weights[i] · data[starts[i] + j]` for `j < out.len()`, each
/// element accumulated in order with fused multiply-adds (the SIMD and
/// portable paths give the same bits; `f16` rows widen exactly first).
/// Panics if a row runs past `data`.
pub fn weighted_sum<T: KvElement>(out: &mut [f32], weights: &[f32], data: &[T], starts: &[usize]) {
    let n = out.len();
    let rows = weights.len().min(starts.len());
    assert!(starts[..rows].iter().all(|&s| s + n <= data.len()), "weighted_sum: a row runs past the data");
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: AVX2, FMA and F16C were detected; every row `starts[i]..starts[i] + n` is in `data` (checked).
        unsafe { avx_rows::weighted_sum(out.as_mut_ptr(), n, &weights[..rows], data.as_ptr(), &starts[..rows]) };
        return;
    }
    out.fill(0.0);
    for (&w, &start) in weights[..rows].iter().zip(&starts[..rows]) {
        for (o, &x) in out.iter_mut().zip(&data[start..start + n]) {
            *o = w.mul_add(x.to_f32(), *o);
        }
    }
}

/// [`weighted_sum`] for several weight vectors over the same rows:
/// `out[h * n + j] = Σ_i weights[h * stride + i] · data[starts[i] + j]` for
/// each of the `out.len() / n` heads. Each row is read once for all heads;
/// every output equals [`weighted_sum`]'s for that head bit for bit (the same
/// fused multiply-adds in the same order).
pub fn weighted_sum_heads<T: KvElement>(out: &mut [f32], n: usize, weights: &[f32], stride: usize, data: &[T], starts: &[usize]) {
    let (heads, rows) = heads_and_rows(out.len(), n, weights.len(), stride, data.len(), starts, "weighted_sum_heads");
    #[cfg(target_arch = "x86_64")]
    if n.is_multiple_of(16) && heads > 0 && rows_wide::available() {
        // SAFETY: AVX-512F detected; heads, weights and rows as checked above.
        unsafe { rows_wide::weighted_sum_heads(out.as_mut_ptr(), heads, n, weights, stride, data.as_ptr(), &starts[..rows]) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if use_avx2() && n.is_multiple_of(16) {
        let mut h = 0;
        while h < heads {
            let take = if heads - h >= 4 { 4 } else if heads - h >= 2 { 2 } else { 1 };
            let (o, w) = (out[h * n..].as_mut_ptr(), &weights[h * stride..]);
            let (d, st) = (data.as_ptr(), &starts[..rows]);
            // SAFETY: AVX2/FMA/F16C detected; `take` heads of n outputs and of `rows` weights
            // (stride apart) exist (checked above); every row is in `data` (checked);
            // each column width divides n.
            unsafe {
                // As many columns as 8 accumulators hold (each output's sum is the
                // same whatever the width: rows are added in order either way).
                match take {
                    4 => avx_rows::weighted_sum_heads::<T, 4, 2>(o, n, w, stride, d, st),
                    2 if n.is_multiple_of(32) => avx_rows::weighted_sum_heads::<T, 2, 4>(o, n, w, stride, d, st),
                    2 => avx_rows::weighted_sum_heads::<T, 2, 2>(o, n, w, stride, d, st),
                    _ if n.is_multiple_of(64) => avx_rows::weighted_sum_heads::<T, 1, 8>(o, n, w, stride, d, st),
                    _ => avx_rows::weighted_sum_heads::<T, 1, 2>(o, n, w, stride, d, st),
                }
            }
            h += take;
        }
        return;
    }
    for (h, o) in out.chunks_exact_mut(n.max(1)).take(heads).enumerate() {
        weighted_sum(o, &weights[h * stride..h * stride + rows], data, &starts[..rows]);
    }
}

/// The heads (`out_len / n`) and rows (`starts`, at most `stride`) of a
/// weighted sum over heads; panics (naming `what`) if the weights are too
/// few or a row runs past the data.
fn heads_and_rows(out_len: usize, n: usize, weights: usize, stride: usize, data: usize, starts: &[usize], what: &str) -> (usize, usize) {
    let heads = out_len.checked_div(n).unwrap_or(0);
    let rows = starts.len().min(stride);
    let needed = heads.checked_sub(1).map(|last| last.checked_mul(stride).and_then(|w| w.checked_add(rows)));
    assert!(needed.is_none_or(|needed| needed.is_some_and(|needed| weights >= needed)), "{what}: too few weights");
    assert!(starts[..rows].iter().all(|&s| n <= data && s <= data - n), "{what}: a row runs past the data");
    (heads, rows)
}

/// [`weighted_sum_heads`] added onto `out`'s values, continuing each
/// element's chain of fused multiply-adds: over rows `a` and then rows `b`
/// it gives the bits of [`weighted_sum_heads`] over `a` followed by `b`
/// (from zeros, as `out` holds them at first). Panics as that does.
pub fn weighted_sum_heads_onto<T: KvElement>(out: &mut [f32], n: usize, weights: &[f32], stride: usize, data: &[T], starts: &[usize]) {
    let (heads, rows) = heads_and_rows(out.len(), n, weights.len(), stride, data.len(), starts, "weighted_sum_heads_onto");
    #[cfg(target_arch = "x86_64")]
    if n.is_multiple_of(16) && heads > 0 && rows_wide::available() {
        // SAFETY: AVX-512F detected; heads, weights and rows as checked above.
        unsafe { rows_wide::weighted_sum_heads_onto(out.as_mut_ptr(), heads, n, weights, stride, data.as_ptr(), &starts[..rows]) };
        return;
    }
    for (h, o) in out.chunks_exact_mut(n.max(1)).take(heads).enumerate() {
        for (&w, &start) in weights[h * stride..h * stride + rows].iter().zip(&starts[..rows]) {
            for (o, &x) in o.iter_mut().zip(&data[start..start + n]) {
                *o = w.mul_add(x.to_f32(), *o);
            }
        }
    }
}

/// Whether [`weighted_sum_heads_onto`] runs on vector registers on this
/// CPU (AVX-512F, rows a multiple of 16 wide); elsewhere it is a plain loop.
pub fn sums_onto_in_registers(n: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        n.is_multiple_of(16) && rows_wide::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = n;
        false
    }
}

/// `e^x` in f32 without a libm call, so loops over it vectorize: Cody-Waite
/// range reduction and the Cephes `expf` polynomial (relative error about
/// 2e-7). Returns exactly `0` below -87 (so `-inf` gives `0`) and exactly `1`
/// at `0`; NaN is not expected.
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let xc = x.clamp(-87.0, 88.0);
    let shifted = xc * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let e = p * r * r + r + 1.0;
    // The low mantissa bits of `shifted` hold n (as an offset integer).
    let n_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    let scale = f32::from_bits(n_bits.wrapping_add(127) << 23);
    if x < -87.0 {
        0.0
    } else {
        e * scale
    }
}

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            lanes[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut sum: f32 = lanes.iter().sum();
    for i in chunks * 8..a.len() {
        sum += a[i] * b[i];
    }
    sum
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(a: *const f32, b: *const f32, n: usize) -> f32 {
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY (whole body): every load is at an index < n, which the caller guarantees readable.
        unsafe {
            while i + 16 <= n {
                acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), acc0);
                acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i + 8)), _mm256_loadu_ps(b.add(i + 8)), acc1);
                i += 16;
            }
            if i + 8 <= n {
                acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), acc0);
                i += 8;
            }
            let v = _mm256_add_ps(acc0, acc1);
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            let mut sum = _mm_cvtss_f32(s);
            while i < n {
                sum += *a.add(i) * *b.add(i);
                i += 1;
            }
            sum
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy(acc: *mut f32, alpha: f32, x: *const f32, n: usize) {
        let va = _mm256_set1_ps(alpha);
        let mut i = 0;
        // SAFETY (whole body): every access is at an index < n, which the caller guarantees valid.
        unsafe {
            while i + 8 <= n {
                let r = _mm256_fmadd_ps(va, _mm256_loadu_ps(x.add(i)), _mm256_loadu_ps(acc.add(i)));
                _mm256_storeu_ps(acc.add(i), r);
                i += 8;
            }
            while i < n {
                *acc.add(i) += alpha * *x.add(i);
                i += 1;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx_rows {
    use super::KvElement;
    use std::arch::x86_64::*;

    /// See [`super::weighted_sum`]: 32 output columns at a time stay in
    /// registers while every row is added in.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn weighted_sum<T: KvElement>(out: *mut f32, n: usize, weights: &[f32], data: *const T, starts: &[usize]) {
        // SAFETY (whole body): out has n elements; each row starts[i]..starts[i] + n is readable.
        unsafe {
            let mut col = 0;
            while col + 32 <= n {
                let mut acc = [_mm256_setzero_ps(); 4];
                for (&w, &start) in weights.iter().zip(starts) {
                    let w = _mm256_set1_ps(w);
                    let row = data.add(start + col);
                    for (j, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(w, T::load8(row.add(8 * j)), *a);
                    }
                }
                for (j, a) in acc.iter().enumerate() {
                    _mm256_storeu_ps(out.add(col + 8 * j), *a);
                }
                col += 32;
            }
            while col + 8 <= n {
                let mut acc = _mm256_setzero_ps();
                for (&w, &start) in weights.iter().zip(starts) {
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(w), T::load8(data.add(start + col)), acc);
                }
                _mm256_storeu_ps(out.add(col), acc);
                col += 8;
            }
            for c in col..n {
                let mut acc = 0f32;
                for (&w, &start) in weights.iter().zip(starts) {
                    acc = w.mul_add((*data.add(start + c)).to_f32(), acc);
                }
                *out.add(c) = acc;
            }
        }
    }

    /// See [`super::weighted_sum_heads`]: `H` heads × `8·C` columns in
    /// registers; each row's `8·C` values are loaded once for all `H` heads.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn weighted_sum_heads<T: KvElement, const H: usize, const C: usize>(out: *mut f32, n: usize, weights: &[f32], stride: usize, data: *const T, starts: &[usize]) {
        // SAFETY (whole body): out has H * n elements; weights has (H - 1) * stride + starts.len();
        // each row starts[i]..starts[i] + n is readable; n is a multiple of 8 * C.
        unsafe {
            for col in (0..n).step_by(8 * C) {
                let mut acc = [[_mm256_setzero_ps(); C]; H];
                for (i, &start) in starts.iter().enumerate() {
                    let row = data.add(start + col);
                    let v: [__m256; C] = std::array::from_fn(|c| T::load8(row.add(8 * c)));
                    for (h, a) in acc.iter_mut().enumerate() {
                        let w = _mm256_set1_ps(*weights.get_unchecked(h * stride + i));
                        for (a, v) in a.iter_mut().zip(&v) {
                            *a = _mm256_fmadd_ps(w, *v, *a);
                        }
                    }
                }
                for (h, a) in acc.iter().enumerate() {
                    for (c, a) in a.iter().enumerate() {
                        _mm256_storeu_ps(out.add(h * n + col + 8 * c), *a);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_onto_over_split_rows_give_the_bits_of_one_sum() {
        for (n, heads) in [(16usize, 1usize), (128, 6), (64, 7), (40, 2)] {
            let rows = 23;
            let data: Vec<f32> = (0..n * 29).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let starts: Vec<usize> = (0..rows).map(|i| (i * 7 % 29) * n).collect();
            let stride = rows + 1;
            let weights: Vec<f32> = (0..heads * stride).map(|i| ((i * 13 % 29) as f32 - 14.0) / 9.0).collect();
            let mut whole = vec![0f32; heads * n];
            weighted_sum_heads(&mut whole, n, &weights, stride, &data, &starts);
            for split in [0usize, 1, 9, 23] {
                let mut parts = vec![0f32; heads * n];
                weighted_sum_heads_onto(&mut parts, n, &weights, stride, &data, &starts[..split]);
                weighted_sum_heads_onto(&mut parts, n, &weights[split..], stride, &data, &starts[split..]);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&parts), bits(&whole), "n {n}, {heads} heads, split at {split}");
            }
        }
    }

    #[test]
    fn weighted_sum_heads_equals_weighted_sum_per_head() {
        for (n, heads) in [(16usize, 1usize), (32, 6), (128, 7), (64, 3), (40, 2), (64, 1), (256, 2), (48, 2), (80, 5), (128, 12)] {
            let rows = 11;
            let data: Vec<f32> = (0..n * 13).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let starts: Vec<usize> = (0..rows).map(|i| (i * 7 % 13) * n).collect();
            let stride = rows + 2;
            let weights: Vec<f32> = (0..heads * stride).map(|i| ((i * 13 % 29) as f32 - 14.0) / 9.0).collect();
            let mut all = vec![0f32; heads * n];
            weighted_sum_heads(&mut all, n, &weights, stride, &data, &starts);
            // f16 rows too (widened sixteen at a time on the 512-bit path).
            let narrow: Vec<half::f16> = data.iter().map(|&v| half::f16::from_f32(v)).collect();
            let mut all16 = vec![0f32; heads * n];
            weighted_sum_heads(&mut all16, n, &weights, stride, &narrow, &starts);
            for h in 0..heads {
                let mut one = vec![0f32; n];
                weighted_sum(&mut one, &weights[h * stride..h * stride + rows], &data, &starts);
                let got: Vec<u32> = all[h * n..(h + 1) * n].iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "n {n}, head {h} of {heads}");
                weighted_sum(&mut one, &weights[h * stride..h * stride + rows], &narrow, &starts);
                let got: Vec<u32> = all16[h * n..(h + 1) * n].iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "f16: n {n}, head {h} of {heads}");
            }
        }
    }

    #[test]
    fn f16_rows_give_the_bits_of_their_f32_widening() {
        // 44, 3 and 77 leave a remainder after the 8-wide loop (the scalar tail).
        for (n, heads) in [(64usize, 1usize), (64, 3), (128, 6), (32, 2), (40, 1), (44, 1), (44, 3), (3, 2), (77, 1)] {
            let narrow: Vec<half::f16> = (0..n * 13).map(|i| half::f16::from_f32(((i * 37 % 101) as f32 - 50.0) / 7.0)).collect();
            let wide: Vec<f32> = narrow.iter().map(|v| v.to_f32()).collect();
            let starts: Vec<usize> = (0..9).map(|i| (i * 5 % 13) * n).collect();
            let weights: Vec<f32> = (0..heads * 9).map(|i| ((i * 13 % 29) as f32 - 14.0) / 9.0).collect();
            let (mut from_f16, mut from_f32) = (vec![0f32; heads * n], vec![0f32; heads * n]);
            weighted_sum_heads(&mut from_f16, n, &weights, 9, &narrow, &starts);
            weighted_sum_heads(&mut from_f32, n, &weights, 9, &wide, &starts);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&from_f16), bits(&from_f32), "n {n}, heads {heads}");
            let mut portable = vec![0f32; heads * n];
            for (h, out) in portable.chunks_mut(n).enumerate() {
                for (&w, &s) in weights[h * 9..(h + 1) * 9].iter().zip(&starts) {
                    for (o, &x) in out.iter_mut().zip(&wide[s..s + n]) {
                        *o = w.mul_add(x, *o);
                    }
                }
            }
            assert_eq!(bits(&from_f16), bits(&portable), "n {n}, heads {heads}: the portable order");
        }
    }

    #[test]
    fn weighted_sum_is_the_same_on_both_paths() {
        for n in [3usize, 8, 32, 40, 64, 77] {
            let data: Vec<f32> = (0..n * 9).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let weights = [0.25f32, -1.5, 0.125, 3.0, 0.7];
            let starts = [0usize, n, 4 * n, 2 * n + 1, 8 * n];
            let mut fast = vec![0f32; n];
            weighted_sum(&mut fast, &weights, &data, &starts);
            let mut portable = vec![0f32; n];
            for (&w, &s) in weights.iter().zip(&starts) {
                for (o, &x) in portable.iter_mut().zip(&data[s..s + n]) {
                    *o = w.mul_add(x, *o);
                }
            }
            assert_eq!(fast.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), portable.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "n = {n}");
        }
    }

    #[test]
    fn dot_and_axpy_match_naive() {
        for n in [1usize, 7, 8, 15, 16, 17, 64, 100] {
            let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
            let b: Vec<f32> = (0..n).map(|i| 1.0 - i as f32 * 0.25).collect();
            let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!((dot(&a, &b) - naive).abs() <= 1e-3 * naive.abs().max(1.0));
            let mut acc = b.clone();
            axpy(&mut acc, 2.0, &a);
            for i in 0..n {
                assert!((acc[i] - (b[i] + 2.0 * a[i])).abs() < 1e-5);
            }
        }
    }
}
