//! Attention scores: one query against many key rows, eight rows at a time.
//!
//! Every dot product is accumulated the same way on both paths and whatever
//! the number of rows (so a query's scores do not depend on how many keys or
//! queries share its call): 8 lanes, lane `l` summing `q[8c + l] · k[8c + l]`
//! over the chunks `c` in order with fused multiply-adds, then the lanes
//! summed pairwise, `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))`, then
//! whatever is left past the last full chunk added in order, then the scale.
//! The key rows may be `f32` or `f16` ([`KvElement`]), widened exactly first.

use super::KvElement;

/// `out[j] = scale · (q · data[starts[j]..starts[j] + q.len()])` for every
/// `j < starts.len()`. Panics if `out` is shorter than `starts` or a row runs
/// past `data`.
pub fn scaled_dots<T: KvElement>(out: &mut [f32], q: &[f32], scale: f32, data: &[T], starts: &[usize]) {
    let d = q.len();
    assert!(out.len() >= starts.len(), "scaled_dots: too few outputs");
    assert!(starts.iter().all(|&s| d <= data.len() && s <= data.len() - d), "scaled_dots: a row runs past the data");
    #[cfg(target_arch = "x86_64")]
    if super::use_avx2() && d.is_multiple_of(8) && !starts.is_empty() {
        // SAFETY: AVX2, FMA and F16C were detected; every row start..start + d is in
        // `data` and `out` holds starts.len() values (both checked above).
        unsafe { avx::scaled_dots(out.as_mut_ptr(), q.as_ptr(), d, scale, data.as_ptr(), starts) };
        return;
    }
    for (o, &s) in out.iter_mut().zip(starts) {
        *o = dot_in_lanes(q, &data[s..s + d]) * scale;
    }
}

/// One dot product in the order described in the module docs.
fn dot_in_lanes<T: KvElement>(q: &[f32], k: &[T]) -> f32 {
    let mut lanes = [0f32; 8];
    let full = q.len() / 8 * 8;
    for (qc, kc) in q[..full].chunks_exact(8).zip(k[..full].chunks_exact(8)) {
        for l in 0..8 {
            lanes[l] = qc[l].mul_add(kc[l].to_f32(), lanes[l]);
        }
    }
    let mut sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    for (a, b) in q[full..].iter().zip(&k[full..]) {
        sum = a.mul_add(b.to_f32(), sum);
    }
    sum
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx {
    use super::KvElement;
    use std::arch::x86_64::*;

    /// Lane i of the result: the pairwise sum of `acc[i]`'s lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(in crate::simd) fn sum_each(acc: [__m256; 8]) -> __m256 {
        // hadd pairs neighbours within each 128-bit half: after two rounds,
        // half h of g0 holds rows 0-3's (l0+l1)+(l2+l3) (h = 0) or
        // (l4+l5)+(l6+l7) (h = 1), and g1 the same for rows 4-7.
        let g0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
        let g1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
        let low = _mm256_permute2f128_ps::<0x20>(g0, g1);
        let high = _mm256_permute2f128_ps::<0x31>(g0, g1);
        _mm256_add_ps(low, high)
    }

    /// See [`super::scaled_dots`]; `d` is a multiple of 8, `starts` is not
    /// empty, every row `start..start + d` is readable and `out` holds
    /// `starts.len()` values. A last group of fewer than 8 rows repeats its
    /// last row in the spare lanes and stores only the real ones.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scaled_dots<T: KvElement>(out: *mut f32, q: *const f32, d: usize, scale: f32, data: *const T, starts: &[usize]) {
        let n = starts.len();
        let vscale = _mm256_set1_ps(scale);
        let mut j = 0;
        // SAFETY (whole body): rows and outputs as the caller guarantees.
        unsafe {
            while j < n {
                let rows: [*const T; 8] = std::array::from_fn(|i| data.add(starts[(j + i).min(n - 1)]));
                let mut acc = [_mm256_setzero_ps(); 8];
                for c in (0..d).step_by(8) {
                    let qv = _mm256_loadu_ps(q.add(c));
                    for (a, row) in acc.iter_mut().zip(&rows) {
                        *a = _mm256_fmadd_ps(qv, T::load8(row.add(c)), *a);
                    }
                }
                let scores = _mm256_mul_ps(sum_each(acc), vscale);
                if j + 8 <= n {
                    _mm256_storeu_ps(out.add(j), scores);
                } else {
                    let mut tmp = [0f32; 8];
                    _mm256_storeu_ps(tmp.as_mut_ptr(), scores);
                    std::ptr::copy_nonoverlapping(tmp.as_ptr(), out.add(j), n - j);
                }
                j += 8;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i + seed) * 37 % 101) as f32 - 50.0) / 13.0).collect()
    }

    #[test]
    fn every_row_count_gives_the_bits_of_the_scalar_order() {
        for d in [8usize, 16, 64, 128, 256, 12, 6] {
            let data = values(d * 40, d);
            let q = values(d, 7);
            for rows in [1usize, 7, 8, 9, 16, 23] {
                let starts: Vec<usize> = (0..rows).map(|i| (i * 13 % 37) * d).collect();
                let mut got = vec![f32::NAN; rows];
                scaled_dots(&mut got, &q, 0.125, &data, &starts);
                for (j, &s) in starts.iter().enumerate() {
                    let want = dot_in_lanes(&q, &data[s..s + d]) * 0.125;
                    assert_eq!(got[j].to_bits(), want.to_bits(), "d {d}, rows {rows}, row {j}");
                    let exact: f64 = q.iter().zip(&data[s..s + d]).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>() * 0.125;
                    assert!((f64::from(got[j]) - exact).abs() < 1e-3, "d {d}: {} vs {exact}", got[j]);
                }
            }
        }
    }

    #[test]
    fn f16_rows_give_the_bits_of_their_f32_widening() {
        for d in [8usize, 64, 12] {
            let wide = values(d * 30, d);
            let narrow: Vec<half::f16> = wide.iter().map(|&v| half::f16::from_f32(v)).collect();
            let widened: Vec<f32> = narrow.iter().map(|v| v.to_f32()).collect();
            let q = values(d, 3);
            for rows in [1usize, 8, 13] {
                let starts: Vec<usize> = (0..rows).map(|i| (i * 11 % 29) * d).collect();
                let (mut from_f16, mut from_f32) = (vec![f32::NAN; rows], vec![f32::NAN; rows]);
                scaled_dots(&mut from_f16, &q, 0.5, &narrow, &starts);
                scaled_dots(&mut from_f32, &q, 0.5, &widened, &starts);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&from_f16), bits(&from_f32), "d {d}, rows {rows}");
            }
        }
    }

    #[test]
    fn a_row_past_the_data_panics() {
        let result = std::panic::catch_unwind(|| {
            let mut out = [0f32; 1];
            scaled_dots(&mut out, &[1.0; 8], 1.0, &[0f32; 12], &[5]);
        });
        assert!(result.is_err());
        let wraps = std::panic::catch_unwind(|| {
            let mut out = [0f32; 1];
            scaled_dots(&mut out, &[1.0; 8], 1.0, &[0f32; 12], &[usize::MAX - 2]);
        });
        assert!(wraps.is_err(), "a start whose end wraps around is refused too");
    }
}
