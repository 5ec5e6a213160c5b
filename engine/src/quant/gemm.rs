//! Prefill GEMM for 4/8-bit weight blocks: 8 tokens per SIMD register lane.
//!
//! The decode kernels in [`super::dot`] put the 32 elements of one block in a
//! register's lanes, so every (row, token, block) needs its own horizontal
//! reduction and scale. For prefill this kernel turns it around: activations
//! of 8 tokens are interleaved ([`Q8Group`]) so each i32 lane accumulates one
//! token; 4 weight bytes are broadcast and multiplied with 4 bytes of each of
//! the 8 tokens in one `vpdpbusd` (AVX-512 VNNI) or `vpmaddubsw`+`vpmaddwd`
//! (AVX2). Scales then apply once per block to 8 tokens at once.
//!
//! Weights are read as unsigned bytes `u` with a per-format offset `o`
//! (Q4_1: value = d·u + m, o = 0; Q4_0: d·(u − 8); Q8_0: d·(u − 128) with
//! u = q + 128), so `Σ w·x = d·dx·(Σ u·q − o·Σq) [+ m·s]`.

use super::dot::{Q8Block, QK};
use crate::gguf::types::GgmlType;

/// Tokens per group (one AVX-512 register of i32 lanes; AVX2 does two halves).
pub const GROUP: usize = 16;

/// One block (32 elements) of 8 tokens' quantized activations, interleaved:
/// `qs[g][t]` holds elements `4g..4g+4` of token `t`.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Q8Group {
    /// Scales per token.
    pub d: [f32; GROUP],
    /// `d · Σq` per token (for Q4_1's offset).
    pub s: [f32; GROUP],
    /// `Σq` per token.
    pub qsum: [i32; GROUP],
    /// Interleaved quantized values.
    pub qs: [[[i8; 4]; GROUP]; QK / 4],
}

impl Default for Q8Group {
    fn default() -> Self {
        Self { d: [0.0; GROUP], s: [0.0; GROUP], qsum: [0; GROUP], qs: [[[0; 4]; GROUP]; QK / 4] }
    }
}

/// Interleave `n` tokens' quantized rows (`nb` blocks each, token-major) into
/// groups of 8 (`n.div_ceil(8) * nb` groups, group-major); missing tokens are zero.
pub fn interleave(xq: &[Q8Block], n: usize, nb: usize) -> Vec<Q8Group> {
    let mut out = vec![Q8Group::default(); n.div_ceil(GROUP) * nb];
    for_each_group(&mut out, nb, n, |dst, lane, t| {
        for (b, dst) in dst.iter_mut().enumerate() {
            let src = &xq[t * nb + b];
            dst.d[lane] = src.d;
            dst.s[lane] = src.s;
            dst.qsum[lane] = src.qsum;
            for (k, chunk) in src.qs.chunks_exact(4).enumerate() {
                dst.qs[k][lane].copy_from_slice(chunk);
            }
        }
    });
    out
}

/// Calls `fill(group's nb blocks, lane, token)` for each of the `n` tokens,
/// groups split across the pool when there are several.
pub(crate) fn for_each_group<G: Send>(out: &mut [G], nb: usize, n: usize, fill: impl Fn(&mut [G], usize, usize) + Sync) {
    let mut groups: Vec<&mut [G]> = out.chunks_mut(nb.max(1)).collect();
    crate::pool::for_each_mut(&mut groups, |g, dst| {
        for lane in 0..GROUP.min(n.saturating_sub(g * GROUP)) {
            fill(dst, lane, g * GROUP + lane);
        }
    });
}

/// One weight row (raw blocks) times one group of 8 tokens (`nb` groups).
pub type GemmFn = fn(&[u8], &[Q8Group]) -> [f32; GROUP];

/// Four weight rows times one group of 16 tokens (each row's result equals [`GemmFn`]'s).
pub type GemmRows4Fn = fn([&[u8]; 4], &[Q8Group]) -> [[f32; GROUP]; 4];

/// Four weight rows times every group of `out.len()`: `(rows, x, nb,
/// out)`, group `g`'s `nb` blocks at `x[g * nb..]`, its results to
/// `out[g]` (each equal to [`GemmRows4Fn`]'s for that group). Each chunk
/// of the rows is unpacked once for all the groups.
pub type GemmRows4GroupsFn = fn([&[u8]; 4], &[Q8Group], usize, &mut [[[f32; GROUP]; 4]]);

/// The grouped kernels for a weight type: one row, and four rows sharing
/// each activation load (where this CPU has a kernel for that).
#[derive(Clone, Copy)]
pub struct GemmKernels {
    /// One row.
    pub one: GemmFn,
    /// Four rows at once.
    pub rows4: Option<GemmRows4Fn>,
    /// Four rows at once, for every group.
    pub rows4_groups: Option<GemmRows4GroupsFn>,
}

/// The best grouped kernels for a weight type on this CPU, if any.
pub fn gemm_kernels(dtype: GgmlType) -> Option<GemmKernels> {
    let one = gemm_kernel(dtype)?;
    #[cfg(target_arch = "x86_64")]
    {
        let vnni = std::is_x86_feature_detected!("avx512vnni")
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("f16c");
        if vnni {
            let (rows4, rows4_groups): (GemmRows4Fn, GemmRows4GroupsFn) = match dtype {
                GgmlType::Q4_0 => (simd::q4_0_vnni_rows4, simd::q4_0_vnni_rows4_groups),
                GgmlType::Q4_1 => (simd::q4_1_vnni_rows4, simd::q4_1_vnni_rows4_groups),
                GgmlType::Q8_0 => (simd::q8_0_vnni_rows4, simd::q8_0_vnni_rows4_groups),
                GgmlType::Q5_0 => (simd::q5_0_vnni_rows4, simd::q5_0_vnni_rows4_groups),
                GgmlType::Q5_1 => (simd::q5_1_vnni_rows4, simd::q5_1_vnni_rows4_groups),
                _ => return Some(GemmKernels { one, rows4: None, rows4_groups: None }),
            };
            return Some(GemmKernels { one, rows4: Some(rows4), rows4_groups: Some(rows4_groups) });
        }
    }
    Some(GemmKernels { one, rows4: None, rows4_groups: None })
}

/// The best grouped kernel for a weight type on this CPU, if any.
pub fn gemm_kernel(dtype: GgmlType) -> Option<GemmFn> {
    #[cfg(target_arch = "x86_64")]
    {
        let vnni = std::is_x86_feature_detected!("avx512vnni")
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw");
        let avx2 = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
        let f16c = std::is_x86_feature_detected!("f16c");
        if f16c && (vnni || avx2) {
            return match (dtype, vnni) {
                (GgmlType::Q4_0, true) => Some(simd::q4_0_vnni),
                (GgmlType::Q4_1, true) => Some(simd::q4_1_vnni),
                (GgmlType::Q8_0, true) => Some(simd::q8_0_vnni),
                (GgmlType::Q4_0, false) => Some(simd::q4_0_avx2),
                (GgmlType::Q4_1, false) => Some(simd::q4_1_avx2),
                (GgmlType::Q8_0, false) => Some(simd::q8_0_avx2),
                (GgmlType::Q5_0, true) => Some(simd::q5_0_vnni),
                (GgmlType::Q5_1, true) => Some(simd::q5_1_vnni),
                (GgmlType::Q5_0, false) => Some(simd::q5_0_avx2),
                (GgmlType::Q5_1, false) => Some(simd::q5_1_avx2),
                _ => None,
            };
        }
    }
    scalar_kernel(dtype)
}

/// The portable kernel (for tests and CPUs without AVX2).
pub fn scalar_kernel(dtype: GgmlType) -> Option<GemmFn> {
    match dtype {
        GgmlType::Q4_0 => Some(|w, x| scalar(w, x, Format::Q4_0)),
        GgmlType::Q4_1 => Some(|w, x| scalar(w, x, Format::Q4_1)),
        GgmlType::Q8_0 => Some(|w, x| scalar(w, x, Format::Q8_0)),
        GgmlType::Q5_0 => Some(|w, x| scalar(w, x, Format::Q5_0)),
        GgmlType::Q5_1 => Some(|w, x| scalar(w, x, Format::Q5_1)),
        _ => None,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Format {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
}

impl Format {
    /// The format whose discriminant is `code` (the kernels take it as a
    /// const parameter, so that every test of the format folds away).
    #[cfg(target_arch = "x86_64")]
    const fn from_code(code: u8) -> Self {
        match code {
            0 => Self::Q4_0,
            1 => Self::Q4_1,
            2 => Self::Q5_0,
            3 => Self::Q5_1,
            4 => Self::Q8_0,
            _ => panic!("not a block format's code"),
        }
    }
    const fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
        }
    }
    const fn offset(self) -> i32 {
        match self {
            Self::Q4_0 => 8,
            Self::Q4_1 | Self::Q5_1 => 0,
            Self::Q5_0 => 16,
            Self::Q8_0 => 128,
        }
    }
    /// Whether the block has a min (`+ m · s`).
    const fn has_min(self) -> bool {
        matches!(self, Self::Q4_1 | Self::Q5_1)
    }
}

/// Unsigned weight values of one block, plus (d, m).
fn unpack(wb: &[u8], f: Format) -> ([u8; QK], f32, f32) {
    let half = |i: usize| half::f16::from_bits(u16::from_le_bytes([wb[i], wb[i + 1]])).to_f32();
    let mut u = [0u8; QK];
    match f {
        Format::Q8_0 => {
            for (o, &b) in u.iter_mut().zip(&wb[2..34]) {
                *o = b ^ 0x80;
            }
            (u, half(0), 0.0)
        }
        Format::Q4_0 | Format::Q4_1 => {
            let q = if f == Format::Q4_1 { &wb[4..20] } else { &wb[2..18] };
            for j in 0..16 {
                u[j] = q[j] & 0x0F;
                u[j + 16] = q[j] >> 4;
            }
            (u, half(0), if f == Format::Q4_1 { half(2) } else { 0.0 })
        }
        Format::Q5_0 | Format::Q5_1 => {
            let h = if f == Format::Q5_1 { 4 } else { 2 };
            let qh = u32::from_le_bytes([wb[h], wb[h + 1], wb[h + 2], wb[h + 3]]);
            let q = &wb[h + 4..h + 20];
            for j in 0..16 {
                u[j] = (q[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
                u[j + 16] = (q[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
            }
            (u, half(0), if f == Format::Q5_1 { half(2) } else { 0.0 })
        }
    }
}

fn scalar(w: &[u8], x: &[Q8Group], f: Format) -> [f32; GROUP] {
    let mut out = [0f32; GROUP];
    for (wb, xg) in w.chunks_exact(f.block_bytes()).zip(x) {
        let (u, d, m) = unpack(wb, f);
        for (t, o) in out.iter_mut().enumerate() {
            let mut acc = 0i32;
            for (k, group) in xg.qs.iter().enumerate() {
                for e in 0..4 {
                    acc += u[4 * k + e] as i32 * group[t][e] as i32;
                }
            }
            acc -= f.offset() * xg.qsum[t];
            *o = (xg.d[t] * d).mul_add(acc as f32, *o);
            if f.has_min() {
                *o = xg.s[t].mul_add(m, *o);
            }
        }
    }
    out
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{Format, Q8Group, GROUP};
    use std::arch::x86_64::*;

    macro_rules! entry_avx2 {
        ($name:ident, $fmt:expr) => {
            pub fn $name(w: &[u8], x: &[Q8Group]) -> [f32; GROUP] {
                let nb = x.len().min(w.len() / $fmt.block_bytes());
                // SAFETY: selected only when the CPU has AVX2, FMA and F16C (see
                // `gemm_kernel`); it reads nb blocks of w and nb groups of x, both in bounds.
                unsafe { avx2::<{ $fmt as u8 }>(w.as_ptr(), x.as_ptr(), nb) }
            }
        };
    }
    macro_rules! entry4 {
        ($name:ident, $fmt:expr) => {
            pub fn $name(w: [&[u8]; 4], x: &[Q8Group]) -> [[f32; GROUP]; 4] {
                let nb = w.iter().fold(x.len(), |nb, row| nb.min(row.len() / $fmt.block_bytes()));
                // SAFETY: selected only when the CPU has AVX-512 VNNI (see `gemm_kernels`);
                // it reads nb blocks of each row and nb groups of x, all in bounds.
                unsafe { vnni_rows::<4, { $fmt as u8 }>(w.map(|row| row.as_ptr()), x.as_ptr(), nb) }
            }
        };
    }
    macro_rules! entry4_groups {
        ($name:ident, $fmt:expr) => {
            pub fn $name(w: [&[u8]; 4], x: &[Q8Group], nb: usize, out: &mut [[[f32; GROUP]; 4]]) {
                let row_bytes = nb.checked_mul($fmt.block_bytes());
                assert!(w.iter().all(|row| row_bytes.is_some_and(|b| row.len() >= b)), "grouped GEMM: weight row shorter than {nb} blocks");
                assert!(out.len().checked_mul(nb).is_some_and(|need| x.len() >= need), "grouped GEMM: {} activation groups for {} x {nb}", x.len(), out.len());
                if nb == 0 {
                    out.fill([[0.0; GROUP]; 4]);
                    return;
                }
                if out.is_empty() {
                    return;
                }
                // SAFETY: selected only when the CPU has AVX-512 VNNI (see `gemm_kernels`);
                // nb blocks of each row and out.len() * nb groups of x, checked above.
                unsafe { vnni_groups::<4, { $fmt as u8 }>(w.map(|row| row.as_ptr()), x.as_ptr(), nb, out) }
            }
        };
    }
    macro_rules! entry_vnni {
        ($name:ident, $fmt:expr) => {
            pub fn $name(w: &[u8], x: &[Q8Group]) -> [f32; GROUP] {
                let nb = x.len().min(w.len() / $fmt.block_bytes());
                // SAFETY: selected only when the CPU has AVX-512 VNNI (see `gemm_kernel`);
                // it reads nb blocks of w and nb groups of x, both in bounds.
                unsafe { vnni_rows::<1, { $fmt as u8 }>([w.as_ptr()], x.as_ptr(), nb)[0] }
            }
        };
    }
    entry4!(q4_0_vnni_rows4, Format::Q4_0);
    entry4!(q4_1_vnni_rows4, Format::Q4_1);
    entry4!(q8_0_vnni_rows4, Format::Q8_0);
    entry4!(q5_0_vnni_rows4, Format::Q5_0);
    entry4!(q5_1_vnni_rows4, Format::Q5_1);
    entry4_groups!(q4_0_vnni_rows4_groups, Format::Q4_0);
    entry4_groups!(q4_1_vnni_rows4_groups, Format::Q4_1);
    entry4_groups!(q8_0_vnni_rows4_groups, Format::Q8_0);
    entry4_groups!(q5_0_vnni_rows4_groups, Format::Q5_0);
    entry4_groups!(q5_1_vnni_rows4_groups, Format::Q5_1);
    entry_vnni!(q4_0_vnni, Format::Q4_0);
    entry_vnni!(q4_1_vnni, Format::Q4_1);
    entry_vnni!(q8_0_vnni, Format::Q8_0);
    entry_avx2!(q4_0_avx2, Format::Q4_0);
    entry_avx2!(q4_1_avx2, Format::Q4_1);
    entry_avx2!(q8_0_avx2, Format::Q8_0);
    entry_vnni!(q5_0_vnni, Format::Q5_0);
    entry_vnni!(q5_1_vnni, Format::Q5_1);
    entry_avx2!(q5_0_avx2, Format::Q5_0);
    entry_avx2!(q5_1_avx2, Format::Q5_1);

    /// Unpack one weight block to 32 unsigned bytes in `buf`; returns (d, m).
    #[inline(always)]
    unsafe fn unpack_block(wb: *const u8, f: Format, buf: &mut [u8; 32]) -> (f32, f32) {
        // SAFETY: the caller guarantees a whole block at wb and F16C support.
        unsafe {
            let half = |p: *const u8| {
                let bits = std::ptr::read_unaligned(p as *const u16);
                _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
            };
            match f {
                Format::Q8_0 => {
                    let q = _mm256_loadu_si256(wb.add(2) as *const __m256i);
                    let u = _mm256_xor_si256(q, _mm256_set1_epi8(-128));
                    _mm256_storeu_si256(buf.as_mut_ptr() as *mut __m256i, u);
                    (half(wb), 0.0)
                }
                Format::Q4_0 | Format::Q4_1 => {
                    let off = if f == Format::Q4_1 { 4 } else { 2 };
                    let q = _mm_loadu_si128(wb.add(off) as *const __m128i);
                    let mask = _mm_set1_epi8(0x0F);
                    let lo = _mm_and_si128(q, mask);
                    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
                    _mm256_storeu_si256(buf.as_mut_ptr() as *mut __m256i, _mm256_set_m128i(hi, lo));
                    (half(wb), if f == Format::Q4_1 { half(wb.add(2)) } else { 0.0 })
                }
                Format::Q5_0 | Format::Q5_1 => {
                    let off = if f == Format::Q5_1 { 4 } else { 2 };
                    let u = crate::quant::dot::unpack_q5(wb.add(off));
                    _mm256_storeu_si256(buf.as_mut_ptr() as *mut __m256i, u);
                    (half(wb), if f == Format::Q5_1 { half(wb.add(2)) } else { 0.0 })
                }
            }
        }
    }

    /// AVX2: 16 tokens as two halves of 8 i32 lanes; `dot4` multiplies
    /// broadcast weight bytes with one interleaved 8-token vector.
    #[inline(always)]
    unsafe fn run_halves(
        w: *const u8,
        x: *const Q8Group,
        nb: usize,
        f: Format,
        signed_weights: bool,
        dot4: impl Fn(__m256i, __m256i, __m256i) -> __m256i,
    ) -> [f32; GROUP] {
        // SAFETY (whole body): nb blocks of w and nb groups of x are readable (see `entry_avx2!`).
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 2];
            let mut buf = [0u8; 32];
            let offset = _mm256_set1_epi32(f.offset());
            for b in 0..nb {
                let xg = &*x.add(b);
                let (d, m) = unpack_block(w.add(b * f.block_bytes()), f, &mut buf);
                for (h, acc) in acc.iter_mut().enumerate() {
                    let mut isum = _mm256_setzero_si256();
                    for k in 0..8 {
                        let wv = _mm256_set1_epi32(std::ptr::read_unaligned(buf.as_ptr().add(4 * k) as *const i32));
                        let xv = _mm256_load_si256(xg.qs[k][8 * h..].as_ptr() as *const __m256i);
                        isum = dot4(isum, wv, xv);
                    }
                    if f.offset() != 0 && !signed_weights {
                        let qsum = _mm256_load_si256(xg.qsum[8 * h..].as_ptr() as *const __m256i);
                        isum = _mm256_sub_epi32(isum, _mm256_mullo_epi32(qsum, offset));
                    }
                    let scale = _mm256_mul_ps(_mm256_load_ps(xg.d[8 * h..].as_ptr()), _mm256_set1_ps(d));
                    *acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum), *acc);
                    if f.has_min() {
                        *acc = _mm256_fmadd_ps(_mm256_load_ps(xg.s[8 * h..].as_ptr()), _mm256_set1_ps(m), *acc);
                    }
                }
            }
            let mut out = [0f32; GROUP];
            _mm256_storeu_ps(out.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), acc[1]);
            out
        }
    }

    /// Blocks unpacked per pass of the VNNI kernel (2.5 KiB of stack per row).
    const UNPACK_BLOCKS: usize = 64;

    /// AVX-512 VNNI, all 16 tokens in one register, one `vpdpbusd` per 4
    /// weights; `R` weight rows at once of format `F` (a [`Format`]'s
    /// discriminant): each activation vector loaded serves all `R` rows. A
    /// chunk of each row is unpacked first, so the main loop's weight
    /// broadcasts are plain memory operands (load ports) rather than shuffles.
    /// Every row sees exactly the float operations of the one-row kernel.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
    unsafe fn vnni_rows<const R: usize, const F: u8>(w: [*const u8; R], x: *const Q8Group, nb: usize) -> [[f32; GROUP]; R] {
        let mut out = [[[0f32; GROUP]; R]];
        // SAFETY: forwarded from the caller (one group of nb blocks at x).
        unsafe { vnni_groups::<R, F>(w, x, nb, &mut out) };
        out[0]
    }

    /// [`vnni_rows`] for `out.len()` groups of 16 tokens (group `g`'s
    /// blocks at `x + g * nb`), each chunk of the rows unpacked once for all
    /// of them; `out[g]` receives group `g`'s results. Each group's sums
    /// carry over from one chunk to the next through `out`, exactly.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
    unsafe fn vnni_groups<const R: usize, const F: u8>(w: [*const u8; R], x: *const Q8Group, nb: usize, out: &mut [[[f32; GROUP]; R]]) {
        let f = const { Format::from_code(F) };
        // SAFETY (whole body): nb blocks of every w[r] and out.len() * nb groups of x are
        // readable (see `entry4!`, `entry4_groups!` and `entry_vnni!`); every unpacked
        // entry is written before it is read.
        unsafe {
            let mut unpacked = std::mem::MaybeUninit::<[[[u8; 32]; UNPACK_BLOCKS]; R]>::uninit();
            let mut scales = std::mem::MaybeUninit::<[[(f32, f32); UNPACK_BLOCKS]; R]>::uninit();
            let unpacked = &mut *unpacked.as_mut_ptr();
            let scales = &mut *scales.as_mut_ptr();
            let offset = _mm512_set1_epi32(f.offset());
            for first in (0..nb).step_by(UNPACK_BLOCKS) {
                let count = (nb - first).min(UNPACK_BLOCKS);
                for r in 0..R {
                    for i in 0..count {
                        let block = w[r].add((first + i) * f.block_bytes());
                        scales[r][i] = unpack_block(block, f, &mut unpacked[r][i]);
                    }
                }
                for (g, o) in out.iter_mut().enumerate() {
                    let mut acc: [__m512; R] = std::array::from_fn(|r| if first == 0 { _mm512_setzero_ps() } else { _mm512_loadu_ps(o[r].as_ptr()) });
                    for i in 0..count {
                        let xg = &*x.add(g * nb + first + i);
                        let xv: [__m512i; 8] =
                            std::array::from_fn(|k| _mm512_load_si512(xg.qs[k].as_ptr() as *const __m512i));
                        let xd = _mm512_load_ps(xg.d.as_ptr());
                        for r in 0..R {
                            let (d, m) = scales[r][i];
                            let wb = unpacked[r][i].as_ptr();
                            let mut isum = _mm512_setzero_si512();
                            for (k, xv) in xv.iter().enumerate() {
                                let wv = _mm512_set1_epi32(std::ptr::read_unaligned(wb.add(4 * k) as *const i32));
                                isum = _mm512_dpbusd_epi32(isum, wv, *xv);
                            }
                            if f.offset() != 0 {
                                let qsum = _mm512_load_si512(xg.qsum.as_ptr() as *const __m512i);
                                isum = _mm512_sub_epi32(isum, _mm512_mullo_epi32(qsum, offset));
                            }
                            let scale = _mm512_mul_ps(xd, _mm512_set1_ps(d));
                            acc[r] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum), acc[r]);
                            if f.has_min() {
                                acc[r] = _mm512_fmadd_ps(_mm512_load_ps(xg.s.as_ptr()), _mm512_set1_ps(m), acc[r]);
                            }
                        }
                    }
                    for (o, acc) in o.iter_mut().zip(acc) {
                        _mm512_storeu_ps(o.as_mut_ptr(), acc);
                    }
                }
            }
        }
    }

    /// AVX2, 16 tokens as two halves of 8 lanes, format `F` (a
    /// [`Format`]'s discriminant, so that its tests fold away).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn avx2<const F: u8>(w: *const u8, x: *const Q8Group, nb: usize) -> [f32; GROUP] {
        let f = const { Format::from_code(F) };
        let ones = _mm256_set1_epi16(1);
        let bias = _mm256_set1_epi8(-128);
        // SAFETY: forwarded; the closures run with this function's features.
        unsafe {
            if f == Format::Q8_0 {
                // u = q + 128 times x can overflow vpmaddubsw's i16 pairs, so
                // multiply |q| by sign(q)·x instead: the same exact Σ q·x.
                run_halves(w, x, nb, f, true, |acc, wv, xv| {
                    let q = _mm256_xor_si256(wv, bias);
                    let p = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(xv, q));
                    _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones))
                })
            } else {
                run_halves(w, x, nb, f, false, |acc, wv, xv| {
                    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), ones))
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dot::{dot_kernel, quantize_row_q8};

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    /// A block count whose byte size wraps must be refused, not read:
    /// 2^62 blocks of 20 bytes wrap to 0 bytes (with no groups, the
    /// activations' check passes too).
    #[test]
    #[cfg_attr(not(host_avx512vnni), ignore = "needs AVX-512 VNNI (the four-row grouped kernels)")]
    #[should_panic(expected = "weight row shorter")]
    fn all_groups_kernel_refuses_a_block_count_that_overflows() {
        let all_groups = gemm_kernels(GgmlType::Q4_1).and_then(|k| k.rows4_groups).expect("a VNNI CPU has the kernel");
        let row = [0u8; 64];
        all_groups([&row, &row, &row, &row], &[], 1 << 62, &mut []);
    }

    #[test]
    fn grouped_kernels_match_the_decode_kernels() {
        let mut seed = 5u64;
        // 66 blocks: the VNNI kernels unpack 64, then 2 (sums carried across).
        let (cols, n) = (2112, 21);
        let nb = cols / QK;
        let x: Vec<f32> = (0..n * cols).map(|_| (lcg(&mut seed) % 2000) as f32 / 700.0 - 1.4).collect();
        let mut xq = vec![Q8Block::default(); n * nb];
        quantize_row_q8(&x, &mut xq);
        let groups = interleave(&xq, n, nb);
        for dtype in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0] {
            let ts = dtype.type_size();
            let mut w: Vec<u8> = (0..nb * ts).map(|_| lcg(&mut seed) as u8).collect();
            for b in w.chunks_exact_mut(ts) {
                b[0..2].copy_from_slice(&half::f16::from_f32(0.03).to_bits().to_le_bytes());
                if matches!(dtype, GgmlType::Q4_1 | GgmlType::Q5_1) {
                    b[2..4].copy_from_slice(&half::f16::from_f32(-0.2).to_bits().to_le_bytes());
                }
            }
            let one = dot_kernel(dtype).expect("decode kernel");
            let mut kernels = vec![gemm_kernel(dtype).expect("kernel"), scalar_kernel(dtype).expect("scalar")];
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c") {
                kernels.push(match dtype {
                    GgmlType::Q4_0 => simd::q4_0_avx2,
                    GgmlType::Q4_1 => simd::q4_1_avx2,
                    GgmlType::Q5_0 => simd::q5_0_avx2,
                    GgmlType::Q5_1 => simd::q5_1_avx2,
                    _ => simd::q8_0_avx2,
                });
            }
            if let Some(rows4) = gemm_kernels(dtype).and_then(|k| k.rows4) {
                // Same scales, different quantized values per row.
                let rows: Vec<Vec<u8>> = (0..4u8)
                    .map(|r| w.iter().enumerate().map(|(i, &b)| if i % ts >= 4 { b ^ r.wrapping_mul(0x5b) } else { b }).collect())
                    .collect();
                let single = gemm_kernel(dtype).expect("kernel");
                let all_groups = gemm_kernels(dtype).and_then(|k| k.rows4_groups).expect("with rows4");
                // NaN first: every result must be written, none carried over.
                let mut together = vec![[[f32::NAN; GROUP]; 4]; n.div_ceil(GROUP)];
                all_groups([&rows[0], &rows[1], &rows[2], &rows[3]], &groups, nb, &mut together);
                for g in 0..n.div_ceil(GROUP) {
                    let xg = &groups[g * nb..(g + 1) * nb];
                    let four = rows4([&rows[0], &rows[1], &rows[2], &rows[3]], xg);
                    for (r, row) in rows.iter().enumerate() {
                        let want = single(row, xg);
                        assert_eq!(four[r].map(f32::to_bits), want.map(f32::to_bits), "{dtype:?} row {r}");
                        assert_eq!(together[g][r].map(f32::to_bits), want.map(f32::to_bits), "{dtype:?} row {r}, all groups at once");
                    }
                }
            }
            for kernel in kernels {
                for g in 0..n.div_ceil(GROUP) {
                    let got = kernel(&w, &groups[g * nb..(g + 1) * nb]);
                    for (lane, got) in got.iter().enumerate().take(GROUP.min(n - g * GROUP)) {
                        let t = g * GROUP + lane;
                        let want = one(&w, &xq[t * nb..(t + 1) * nb]);
                        assert_eq!(got.to_bits(), want.to_bits(), "{dtype:?} t{t}: {got} vs {want}");
                    }
                }
            }
        }
    }
}
