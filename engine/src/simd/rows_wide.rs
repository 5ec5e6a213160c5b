//! [`super::weighted_sum_heads`] on 512-bit registers: up to six heads ×
//! 64 columns of accumulators (24 registers), each value row's 64 columns
//! widened once for all of them. Every output element is the same fused
//! multiply-adds over the rows in order as on the 256-bit path, so the
//! bits are the same.

use super::KvElement;
use std::arch::x86_64::*;

/// Whether the CPU has AVX-512F (and the 256-bit path's features; checked once).
pub fn available() -> bool {
    static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WIDE.get_or_init(|| super::use_avx2() && std::is_x86_feature_detected!("avx512f"))
}

/// See [`super::weighted_sum_heads`]: `heads` outputs of `n` (a multiple
/// of 16) values, head `h`'s weights at `weights[h · stride..]`.
///
/// # Safety
/// AVX-512F must be available ([`available`]); `out` holds `heads · n`
/// values; `weights` holds `(heads − 1) · stride + starts.len()`; every row
/// `start..start + n` of `data` is readable.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub unsafe fn weighted_sum_heads<T: KvElement>(out: *mut f32, heads: usize, n: usize, weights: &[f32], stride: usize, data: *const T, starts: &[usize]) {
    // SAFETY: forwarded.
    unsafe { heads_from::<T, false>(out, heads, n, weights, stride, data, starts) }
}

/// [`weighted_sum_heads`] continued from `out`'s values (see
/// [`super::weighted_sum_heads_onto`]).
///
/// # Safety
/// As [`weighted_sum_heads`].
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub unsafe fn weighted_sum_heads_onto<T: KvElement>(out: *mut f32, heads: usize, n: usize, weights: &[f32], stride: usize, data: *const T, starts: &[usize]) {
    // SAFETY: forwarded.
    unsafe { heads_from::<T, true>(out, heads, n, weights, stride, data, starts) }
}

/// Both entries: the accumulators start from zeros, or from `out` (`ONTO`).
///
/// # Safety
/// As [`weighted_sum_heads`], with its target features enabled.
#[inline(always)]
unsafe fn heads_from<T: KvElement, const ONTO: bool>(out: *mut f32, heads: usize, n: usize, weights: &[f32], stride: usize, data: *const T, starts: &[usize]) {
    let mut h = 0;
    while h < heads {
        let take = (heads - h).min(6);
        let (o, w) = (out.wrapping_add(h * n), &weights[h * stride..]);
        let mut col = 0;
        // SAFETY (all calls): as this function's contract, for heads h..h + take and
        // columns col..col + 16·C, which lie inside n.
        unsafe {
            while col + 64 <= n {
                columns::<T, ONTO, 4>(take, o, col, n, w, stride, data, starts);
                col += 64;
            }
            while col + 16 <= n {
                columns::<T, ONTO, 1>(take, o, col, n, w, stride, data, starts);
                col += 16;
            }
        }
        h += take;
    }
}

/// [`block`] for `take` (1 to 6) heads, `16·C` columns.
///
/// # Safety
/// As [`block`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn columns<T: KvElement, const ONTO: bool, const C: usize>(take: usize, o: *mut f32, col: usize, n: usize, w: &[f32], stride: usize, data: *const T, starts: &[usize]) {
    // SAFETY: forwarded.
    unsafe {
        match take {
            6 => block::<T, ONTO, 6, C>(o, col, n, w, stride, data, starts),
            5 => block::<T, ONTO, 5, C>(o, col, n, w, stride, data, starts),
            4 => block::<T, ONTO, 4, C>(o, col, n, w, stride, data, starts),
            3 => block::<T, ONTO, 3, C>(o, col, n, w, stride, data, starts),
            2 => block::<T, ONTO, 2, C>(o, col, n, w, stride, data, starts),
            _ => block::<T, ONTO, 1, C>(o, col, n, w, stride, data, starts),
        }
    }
}

/// Columns `col..col + 16·C` of `H` heads: `out[h·n + c] = Σ_i w[h·stride +
/// i] · row_i[c]`, the rows in order, from zeros or (`ONTO`) from `out`.
///
/// # Safety
/// As [`weighted_sum_heads`], for these heads and columns.
#[inline(always)]
unsafe fn block<T: KvElement, const ONTO: bool, const H: usize, const C: usize>(out: *mut f32, col: usize, n: usize, weights: &[f32], stride: usize, data: *const T, starts: &[usize]) {
    // SAFETY (whole body): as the caller guarantees.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); C]; H];
        if ONTO {
            for (h, a) in acc.iter_mut().enumerate() {
                for (c, a) in a.iter_mut().enumerate() {
                    *a = _mm512_loadu_ps(out.add(h * n + col + 16 * c));
                }
            }
        }
        for (i, &start) in starts.iter().enumerate() {
            let row = data.add(start + col);
            let mut v = [_mm512_setzero_ps(); C];
            for (c, v) in v.iter_mut().enumerate() {
                *v = T::load16(row.add(16 * c));
            }
            for (h, a) in acc.iter_mut().enumerate() {
                let w = _mm512_set1_ps(*weights.get_unchecked(h * stride + i));
                for (a, v) in a.iter_mut().zip(&v) {
                    *a = _mm512_fmadd_ps(w, *v, *a);
                }
            }
        }
        for (h, a) in acc.iter().enumerate() {
            for (c, a) in a.iter().enumerate() {
                _mm512_storeu_ps(out.add(h * n + col + 16 * c), *a);
            }
        }
    }
}
