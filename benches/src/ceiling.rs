//! The CPU's integer multiply-add ceiling, for the kernel benchmarks to be
//! read against: `vpdpbusd` (AVX-512 VNNI, 64 u8×i8 multiply-adds each) on
//! its own, and the inner loop of the grouped K-quant kernels with
//! everything else taken away (weights already unpacked, all data in the L1,
//! no conversion to floats): per run of `K` weight words, `K` `vpdpbusd`
//! into a fresh sum per row and group, then the sum times the run's integer
//! scale (`vpmulld`) added to a total. Q4_K's runs are 32 values (`K` = 8),
//! Q6_K's 16 (`K` = 4).

/// Multiply-adds per `vpdpbusd` on 512-bit registers.
pub const MACS_PER_DPBUSD: u64 = 64;

/// Independent accumulators in [`dpbusd_only`]: enough to cover the
/// instruction's latency on current CPUs.
pub const CHAINS: usize = 12;

/// Whether this CPU runs the loops here (AVX-512F/BW and VNNI).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw") && std::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Runs `iters` × [`CHAINS`] `vpdpbusd`, each with a weight word broadcast
/// from `words` (as the kernels do), and returns the sum of the
/// accumulators (so the work cannot be skipped), or `None` where
/// [`available`] is false.
pub fn dpbusd_only(iters: usize, words: &[i32; 64]) -> Option<i32> {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: the features were detected just above.
        return Some(unsafe { x86::dpbusd_only(iters, words) });
    }
    let _ = (iters, words);
    None
}

/// The inner loop of the grouped kernels for `R` rows and `G` groups of 16
/// tokens, over `passes` passes of one 256-value super-block in runs of
/// `4 * K` values: returns the wrapped sum of the totals, or `None` where
/// [`available`] is false. `vpdpbusd` per call: `passes * 64 * R * G`.
pub fn runs<const R: usize, const G: usize, const K: usize>(passes: usize, data: &RunData) -> Option<i32> {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: the features were detected just above.
        return Some(unsafe { x86::runs::<R, G, K>(passes, data) });
    }
    let _ = (passes, data);
    None
}

/// Inputs of [`runs`]: one super-block of unpacked weights for 4 rows,
/// the activations of 2 groups (one 64-byte vector per weight word), and
/// an integer scale per row and run.
#[repr(C, align(64))]
pub struct RunData {
    /// `x[g][k]`: 16 tokens' values `4k..4k + 4` of group `g`.
    pub x: [[[i8; 64]; 64]; 2],
    /// `u[r]`: row `r`'s 256 unsigned values.
    pub u: [[u8; 256]; 4],
    /// `scales[r][run]`: row `r`'s integer scale of each run (up to 16).
    pub scales: [[i32; 16]; 4],
}

impl RunData {
    /// Deterministic small values (weights below 16, scales below 64, as Q4_K's).
    pub fn new() -> Box<Self> {
        let mut d = Box::new(Self { x: [[[0; 64]; 64]; 2], u: [[0; 256]; 4], scales: [[0; 16]; 4] });
        for (i, v) in d.x.iter_mut().flatten().flatten().enumerate() {
            *v = ((i * 37) % 255) as i8;
        }
        for (i, v) in d.u.iter_mut().flatten().enumerate() {
            *v = ((i * 7) % 16) as u8;
        }
        for (i, v) in d.scales.iter_mut().flatten().enumerate() {
            *v = ((i * 11) % 64) as i32;
        }
        d
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{RunData, CHAINS};
    use std::arch::x86_64::*;

    /// See [`super::dpbusd_only`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn dpbusd_only(iters: usize, words: &[i32; 64]) -> i32 {
        let mut acc = [_mm512_setzero_si512(); CHAINS];
        let mut x = _mm512_set1_epi8(3);
        for n in 0..iters {
            // A different quarter of the words each pass, so no load is hoisted.
            let base = (n & 3) * 16;
            for (c, a) in acc.iter_mut().enumerate() {
                *a = _mm512_dpbusd_epi32(*a, _mm512_set1_epi32(words[base + c]), x);
            }
            x = std::hint::black_box(x);
        }
        _mm512_reduce_add_epi32(acc.iter().fold(_mm512_setzero_si512(), |s, a| _mm512_add_epi32(s, *a)))
    }

    /// See [`super::runs`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn runs<const R: usize, const G: usize, const K: usize>(passes: usize, d: &RunData) -> i32 {
        let mut tot = [[_mm512_setzero_si512(); R]; G];
        for _ in 0..passes {
            let d = std::hint::black_box(d);
            for run in 0..64 / K {
                let mut isum = [[_mm512_setzero_si512(); R]; G];
                for k in run * K..(run + 1) * K {
                    // SAFETY: k < 64 rows of 64 aligned bytes.
                    let xv: [__m512i; G] = std::array::from_fn(|g| unsafe { _mm512_load_si512(d.x[g][k].as_ptr() as *const __m512i) });
                    for (r, row) in d.u[..R].iter().enumerate() {
                        // SAFETY: 4k + 4 <= 256 bytes of the row.
                        let w = _mm512_set1_epi32(unsafe { std::ptr::read_unaligned(row.as_ptr().add(4 * k) as *const i32) });
                        for g in 0..G {
                            isum[g][r] = _mm512_dpbusd_epi32(isum[g][r], w, xv[g]);
                        }
                    }
                }
                for (r, scales) in d.scales[..R].iter().enumerate() {
                    let scale = _mm512_set1_epi32(scales[run % 16]);
                    for g in 0..G {
                        tot[g][r] = _mm512_add_epi32(tot[g][r], _mm512_mullo_epi32(isum[g][r], scale));
                    }
                }
            }
        }
        let all = tot.iter().flatten().fold(_mm512_setzero_si512(), |s, t| _mm512_add_epi32(s, *t));
        _mm512_reduce_add_epi32(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loops compute what they claim (so the benchmark measures real work).
    #[test]
    #[cfg_attr(not(host_avx512vnni), ignore = "needs a CPU with AVX-512 VNNI")]
    fn the_loops_compute_their_sums() {
        assert!(available(), "built on a CPU with AVX-512 VNNI, but it is not detected here");
        let words: [i32; 64] = std::array::from_fn(|i| (i as i32) * 0x0101_0101);
        // Each pass: chain c adds 4 bytes of (base + c) times 3, in 16 lanes.
        let want: i64 = (0..5usize).map(|n| (0..CHAINS).map(|c| 16 * 4 * 3 * ((n & 3) * 16 + c) as i64).sum::<i64>()).sum();
        assert_eq!(dpbusd_only(5, &words), Some(want as i32));
        let d = RunData::new();
        assert_eq!(runs::<4, 1, 8>(2, &d), Some(expected(&d, 2, 1, 8)));
        assert_eq!(runs::<4, 2, 4>(3, &d), Some(expected(&d, 3, 2, 4)));
    }

    /// What [`runs`] must return for 4 rows, `groups` groups and runs of
    /// `k` words, over `passes` passes (wrapped to i32, as the lanes wrap).
    fn expected(d: &RunData, passes: i64, groups: usize, k: usize) -> i32 {
        let mut want = 0i64;
        for r in 0..4 {
            for run in 0..64 / k {
                let scale = d.scales[r][run % 16] as i64;
                for w in run * k..(run + 1) * k {
                    for g in 0..groups {
                        for t in 0..16 {
                            let dot: i64 = (0..4).map(|j| d.u[r][4 * w + j] as i64 * d.x[g][w][4 * t + j] as i64).sum();
                            want += passes * scale * dot;
                        }
                    }
                }
            }
        }
        want as i32
    }
}
