//! f32 vector primitives (dot product, scaled add) with an AVX2/FMA path
//! chosen at run time and a portable fallback.

use std::sync::OnceLock;

fn use_avx2() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
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

#[cfg(test)]
mod tests {
    use super::*;

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
