//! Where a matmul task writes its results: the job's `[tokens, rows]`
//! output, with stores that transpose the grouped kernels' `[row][token]`
//! results in registers.

use super::SendPtr;
use crate::quant::gemm::GROUP;

/// Where a matmul task writes: job output `[tokens, rows]`, row-major.
/// Tasks own disjoint sets of rows, so their writes never overlap.
#[derive(Clone, Copy)]
pub(super) struct Sink {
    /// The job's output.
    pub(super) ptr: SendPtr,
    /// Rows of the job's layer.
    pub(super) rows: usize,
    /// Tokens of the batch.
    pub(super) tokens: usize,
}

impl Sink {
    /// `out[t, r] = v`; indices outside the output are ignored (never happens:
    /// the kernels only produce rows of the task and tokens of the batch).
    #[inline(always)]
    pub(super) fn put(&self, r: usize, t: usize, v: f32) {
        if r < self.rows && t < self.tokens {
            // SAFETY: in bounds of the job's `[tokens, rows]` output (checked in
            // `matmul_many` and just above); each row belongs to one task.
            unsafe { *self.ptr.get().add(t * self.rows + r) = v }
        }
    }

    /// Rows `r..r + 4` of group `g` (tokens `16g..`, those below `n`), from
    /// a grouped kernel's `out[row][lane]`, one store per token.
    /// Four tokens at a time are transposed in registers (SSE, baseline on
    /// x86-64) rather than gathered from four arrays value by value.
    #[inline(always)]
    pub(super) fn put_group4(&self, r: usize, g: usize, out: &[[f32; GROUP]; 4], n: usize) {
        let lanes = n.saturating_sub(g * GROUP).min(GROUP);
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if r + 4 <= self.rows && g * GROUP + lanes <= self.tokens {
            use std::arch::x86_64::*;
            while done + 4 <= lanes {
                // SAFETY: SSE2 is part of x86-64; lanes done..done + 4 are inside
                // each `out` row; tokens g·GROUP + done.. + 4 and rows r..r + 4
                // are inside the job's output (checked above) and belong to this task.
                unsafe {
                    let [a, b, c, d] = out.each_ref().map(|row| _mm_loadu_ps(row.as_ptr().add(done)));
                    let (ab_lo, cd_lo) = (_mm_unpacklo_ps(a, b), _mm_unpacklo_ps(c, d));
                    let (ab_hi, cd_hi) = (_mm_unpackhi_ps(a, b), _mm_unpackhi_ps(c, d));
                    let tokens = [_mm_movelh_ps(ab_lo, cd_lo), _mm_movehl_ps(cd_lo, ab_lo), _mm_movelh_ps(ab_hi, cd_hi), _mm_movehl_ps(cd_hi, ab_hi)];
                    let first = self.ptr.get().add((g * GROUP + done) * self.rows + r);
                    for (i, t) in tokens.into_iter().enumerate() {
                        _mm_storeu_ps(first.add(i * self.rows), t);
                    }
                }
                done += 4;
            }
        }
        for lane in done..lanes {
            self.put4(r, g * GROUP + lane, out.each_ref().map(|row| row[lane]));
        }
    }

    /// Rows `r..r + 16` of group `g` (as [`Sink::put_group4`], 16 rows):
    /// a whole group inside the output is transposed in AVX-512 registers
    /// and stored one token (16 rows) at a time; anything else goes four rows at a time.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn put_group16(&self, r: usize, g: usize, out: &[[f32; GROUP]; 16], n: usize) {
        let lanes = n.saturating_sub(g * GROUP).min(GROUP);
        if lanes == GROUP && r + 16 <= self.rows && (g + 1) * GROUP <= self.tokens {
            // SAFETY: AVX-512F (the caller's contract).
            let tokens = unsafe { crate::simd::transpose16(out) };
            for (lane, t) in tokens.into_iter().enumerate() {
                // SAFETY: token g·GROUP + lane and rows r..r + 16 are inside the
                // job's output (checked above) and belong to this task.
                unsafe { std::arch::x86_64::_mm512_storeu_ps(self.ptr.get().add((g * GROUP + lane) * self.rows + r), t) };
            }
            return;
        }
        for (q, four) in out.chunks_exact(4).enumerate() {
            if let Ok(four) = <&[[f32; GROUP]; 4]>::try_from(four) {
                self.put_group4(r + 4 * q, g, four, n);
            }
        }
    }

    /// `out[t, r..r + 4] = v`: four rows' results for one token in one
    /// store; out-of-range positions are ignored, as in [`Sink::put`].
    #[inline(always)]
    pub(super) fn put4(&self, r: usize, t: usize, v: [f32; 4]) {
        if r + 4 <= self.rows && t < self.tokens {
            // SAFETY: in bounds as checked; rows r..r + 4 belong to this task.
            unsafe { std::ptr::write_unaligned(self.ptr.get().add(t * self.rows + r) as *mut [f32; 4], v) }
        } else {
            for (i, x) in v.into_iter().enumerate() {
                self.put(r + i, t, x);
            }
        }
    }
}

/// Where the grouped K-quant kernels ([`super::kquant_grouped`]) write a
/// group's results: token-major ([`Sink`]), or lane-major into a task's
/// buffer (the fused MLP's, [`super::mlp`]).
pub(super) trait GroupSink: Sync {
    /// Row `r` of token `t`.
    fn put(&self, r: usize, t: usize, v: f32);
    /// Rows `r..r + 4` of group `g` (tokens below `n`), `out[row][lane]`.
    fn put_group4(&self, r: usize, g: usize, out: &[[f32; GROUP]; 4], n: usize);
    /// Rows `r..r + 16` of group `g` (tokens below `n`), `out[row][lane]`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn put_group16(&self, r: usize, g: usize, out: &[[f32; GROUP]; 16], n: usize);
}

impl GroupSink for Sink {
    #[inline(always)]
    fn put(&self, r: usize, t: usize, v: f32) {
        Sink::put(self, r, t, v)
    }

    #[inline(always)]
    fn put_group4(&self, r: usize, g: usize, out: &[[f32; GROUP]; 4], n: usize) {
        Sink::put_group4(self, r, g, out, n)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn put_group16(&self, r: usize, g: usize, out: &[[f32; GROUP]; 16], n: usize) {
        // SAFETY: forwarded (AVX-512F).
        unsafe { Sink::put_group16(self, r, g, out, n) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What writing `out` (`[row][lane]`) as rows `r..` of group `g` must
    /// leave in a `[tokens, rows]` output filled with -1: clipped at both ends.
    fn written(out: &[[f32; GROUP]], rows: usize, tokens: usize, r: usize, g: usize) -> Vec<f32> {
        let mut want = vec![-1f32; rows * tokens];
        for lane in 0..GROUP {
            for (i, row) in out.iter().enumerate() {
                let t = g * GROUP + lane;
                if t < tokens && r + i < rows {
                    want[t * rows + r + i] = row[lane];
                }
            }
        }
        want
    }

    #[test]
    fn put4_writes_four_rows_of_one_token_and_clips_at_the_last_row() {
        let (rows, tokens) = (6, 3);
        let mut out = vec![0f32; rows * tokens];
        let write = Sink { ptr: SendPtr(out.as_mut_ptr()), rows, tokens };
        write.put4(1, 2, [1.0, 2.0, 3.0, 4.0]);
        write.put4(4, 0, [5.0, 6.0, 7.0, 8.0]);
        write.put4(0, 3, [9.0; 4]);
        let mut want = vec![0f32; rows * tokens];
        want[2 * rows + 1..2 * rows + 5].copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        want[4..6].copy_from_slice(&[5.0, 6.0]);
        assert_eq!(out, want);
    }

    #[test]
    fn put_group4_transposes_every_lane_and_clips_at_the_batch_and_the_rows() {
        let out: [[f32; GROUP]; 4] = std::array::from_fn(|i| std::array::from_fn(|lane| (100 * i + lane) as f32));
        for (rows, tokens, r, g) in [(8usize, 40usize, 4usize, 1usize), (6, 23, 0, 1), (6, 7, 2, 0), (5, 16, 2, 0)] {
            let mut got = vec![-1f32; rows * tokens];
            let write = Sink { ptr: SendPtr(got.as_mut_ptr()), rows, tokens };
            write.put_group4(r, g, &out, tokens);
            assert_eq!(got, written(&out, rows, tokens, r, g), "rows {rows}, tokens {tokens}, r {r}, group {g}");
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    #[cfg_attr(not(host_avx512), ignore = "needs a CPU with AVX-512")]
    fn put_group16_transposes_whole_groups_and_clips_partial_ones() {
        let out: [[f32; GROUP]; 16] = std::array::from_fn(|i| std::array::from_fn(|lane| (100 * i + lane) as f32));
        // A whole group (the transpose), a partial group, and rows past the end.
        for (rows, tokens, r, g) in [(48usize, 40usize, 16usize, 1usize), (32, 23, 16, 1), (20, 32, 8, 0)] {
            let mut got = vec![-1f32; rows * tokens];
            let write = Sink { ptr: SendPtr(got.as_mut_ptr()), rows, tokens };
            // SAFETY: AVX-512F (host_avx512).
            unsafe { write.put_group16(r, g, &out, tokens) };
            assert_eq!(got, written(&out, rows, tokens, r, g), "rows {rows}, tokens {tokens}, r {r}, group {g}");
        }
    }
}
