//! 16 × 16 f32 transpose in AVX-512 registers (four shuffle stages).

use std::arch::x86_64::*;

/// Columns of `m` (a 16 × 16 row-major block): `out[c][r] = m[r][c]`.
///
/// # Safety
/// The CPU must have AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
pub unsafe fn transpose16(m: &[[f32; 16]; 16]) -> [__m512; 16] {
    // SAFETY: each row is 16 readable floats.
    let r: [__m512; 16] = std::array::from_fn(|i| unsafe { _mm512_loadu_ps(m[i].as_ptr()) });
    // Stage 1: 32-bit interleave of row pairs.
    let t: [__m512; 16] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 { _mm512_unpacklo_ps(a, b) } else { _mm512_unpackhi_ps(a, b) }
    });
    // Stage 2: 64-bit pairs; u[4q + j] holds, in each 128-bit lane L,
    // column 4L + j of rows 4q..4q+4.
    let u: [__m512; 16] = std::array::from_fn(|i| {
        let (q, j) = (i / 4, i % 4);
        let (a, b) = (t[4 * q + j / 2], t[4 * q + j / 2 + 2]);
        if j % 2 == 0 { _mm512_shuffle_ps::<0x44>(a, b) } else { _mm512_shuffle_ps::<0xEE>(a, b) }
    });
    // Stage 3: v[8h + j] (j < 4) holds columns j and j + 8, v[8h + 4 + j]
    // columns j + 4 and j + 12, of rows 8h..8h+8 (lanes: rows 8h..+4 then +4..+8).
    let v: [__m512; 16] = std::array::from_fn(|i| {
        let (h, j) = (i / 8, i % 8);
        let (a, b) = (u[8 * h + j % 4], u[8 * h + 4 + j % 4]);
        if j < 4 { _mm512_shuffle_f32x4::<0x88>(a, b) } else { _mm512_shuffle_f32x4::<0xDD>(a, b) }
    });
    // Stage 4: column c from v[c % 8] (rows 0..8) and v[8 + c % 8] (rows 8..16).
    std::array::from_fn(|c| {
        let (a, b) = (v[c % 8], v[8 + c % 8]);
        if c < 8 { _mm512_shuffle_f32x4::<0x88>(a, b) } else { _mm512_shuffle_f32x4::<0xDD>(a, b) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(not(host_avx512), ignore = "needs a CPU with AVX-512")]
    fn transposes_every_element() {
        let m: [[f32; 16]; 16] = std::array::from_fn(|r| std::array::from_fn(|c| (r * 16 + c) as f32));
        // SAFETY: AVX-512F (host_avx512).
        let cols = unsafe { transpose16(&m) };
        for (c, col) in cols.iter().enumerate() {
            let mut out = [0f32; 16];
            // SAFETY: as above; out holds 16 floats.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr(), *col) };
            for (r, v) in out.iter().enumerate() {
                assert_eq!(*v, m[r][c], "column {c} row {r}");
            }
        }
    }
}
