//! Activation quantization to 8-bit blocks and the integer dot products that
//! multiply them with 4-, 5- and 8-bit weight blocks (Q4_0, Q4_1, Q5_0, Q5_1,
//! Q8_0). K-quants have their own activation blocks and kernels (`kquant`).
//!
//! This is how the CPU backend keeps weights quantized: a row of activations
//! is quantized once per matmul to [`Q8Block`]s (32 values, one f32 scale, and
//! the scaled sum needed by formats with an offset), and each weight row is
//! dotted with it using 8-bit integer multiply-adds. AVX2 kernels are chosen at
//! run time; a scalar fallback gives the same result on any CPU.

use crate::gguf::types::GgmlType;

/// Elements per quantization block.
pub const QK: usize = 32;

/// 32 activations quantized to i8 with one scale (`d`) and `s = d * sum(qs)`.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(8))]
pub struct Q8Block {
    /// Scale: value = d * q.
    pub d: f32,
    /// `d * Σq` (used by Q4_0 / Q4_1 offsets; the quantized sum, not the exact
    /// one, so its rounding error cancels against the product term's).
    pub s: f32,
    /// Σq (used by Q4_0's and Q8_0's offsets in the grouped kernels).
    pub qsum: i32,
    /// The quantized values.
    pub qs: [i8; QK],
}

/// Quantize `x` (a multiple of 32 long) into `out` (x.len() / 32 blocks).
pub fn quantize_row_q8(x: &[f32], out: &mut [Q8Block]) {
    if super::quantize_avx512::available() {
        super::quantize_avx512::quantize_row(x, out)
    } else {
        quantize_row_q8_scalar(x, out)
    }
}

/// The portable quantizer (the definition the SIMD one must match bit for bit).
pub fn quantize_row_q8_scalar(x: &[f32], out: &mut [Q8Block]) {
    for (chunk, block) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = inverse_scale(d);
        let mut sum = 0i32;
        for (q, v) in block.qs.iter_mut().zip(chunk) {
            let r = round_half_away(v * inv).clamp(-127, 127);
            *q = r as i8;
            sum += r;
        }
        block.d = d;
        block.s = d * sum as f32;
        block.qsum = sum;
    }
}

/// `1 / d` for an activation block's scale `d`, or 0 where `d` is 0 or so
/// small (below ~2.9e-39, from a block whose largest |x| is below ~3.7e-37)
/// that the reciprocal overflows: such a block quantizes to zeros instead of
/// to infinities.
pub(crate) fn inverse_scale(d: f32) -> f32 {
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    if inv.is_finite() {
        inv
    } else {
        0.0
    }
}

/// `x.round() as i32` for |x| < 2^23, without the libm call `f32::round`
/// compiles to, so the quantization loop vectorizes: truncate, then step
/// away from zero when the exact remainder is at least one half.
#[inline(always)]
pub(crate) fn round_half_away(x: f32) -> i32 {
    let t = x as i32;
    let frac = x - t as f32;
    t + (frac >= 0.5) as i32 - (frac <= -0.5) as i32
}

/// A dot product of one weight row (raw GGUF block bytes) with quantized activations.
pub type DotFn = fn(&[u8], &[Q8Block]) -> f32;

/// Dot products of one weight row with 4 token rows of quantized activations
/// laid out `stride` blocks apart (`x[j * stride..]` is token j); the weight
/// blocks are unpacked once for all four.
pub type Dot4Fn = fn(&[u8], &[Q8Block], usize) -> [f32; 4];

/// Dot products of 4 weight rows with one token row of quantized activations.
pub type Rows4Fn = fn([&[u8]; 4], &[Q8Block]) -> [f32; 4];

/// Integer kernels for one weight type: single-row, 4-token and 4-row.
#[derive(Clone, Copy)]
pub struct DotKernels {
    /// One weight row · one token.
    pub one: DotFn,
    /// One weight row · four tokens.
    pub four: Dot4Fn,
    /// Four weight rows · one token (decode: four independent chains in flight).
    pub rows4: Rows4Fn,
}

/// The fastest kernels for a weight type, or `None` (see [`dot_kernel`]).
pub fn dot_kernels(dtype: GgmlType) -> Option<DotKernels> {
    let avx2 = has_avx2();
    let one = dot_kernel(dtype)?;
    let four: Dot4Fn = match (dtype, avx2) {
        (GgmlType::Q4_0, true) => avx2::dot4_q4_0,
        (GgmlType::Q4_1, true) => avx2::dot4_q4_1,
        (GgmlType::Q8_0, true) => avx2::dot4_q8_0,
        (GgmlType::Q5_0, true) => avx2::dot4_q5_0,
        (GgmlType::Q5_1, true) => avx2::dot4_q5_1,
        (GgmlType::Q4_0, false) => |w, x, s| scalar_four(scalar::dot_q4_0, w, x, s),
        (GgmlType::Q4_1, false) => |w, x, s| scalar_four(scalar::dot_q4_1, w, x, s),
        (GgmlType::Q5_0, false) => |w, x, s| scalar_four(scalar::dot_q5_0, w, x, s),
        (GgmlType::Q5_1, false) => |w, x, s| scalar_four(scalar::dot_q5_1, w, x, s),
        _ => |w, x, s| scalar_four(scalar::dot_q8_0, w, x, s),
    };
    let rows4: Rows4Fn = match (dtype, avx2) {
        (GgmlType::Q4_0, true) => avx2::rows4_q4_0,
        (GgmlType::Q4_1, true) => avx2::rows4_q4_1,
        (GgmlType::Q8_0, true) => avx2::rows4_q8_0,
        (GgmlType::Q5_0, true) => avx2::rows4_q5_0,
        (GgmlType::Q5_1, true) => avx2::rows4_q5_1,
        (GgmlType::Q4_0, false) => |w, x| w.map(|r| scalar::dot_q4_0(r, x)),
        (GgmlType::Q4_1, false) => |w, x| w.map(|r| scalar::dot_q4_1(r, x)),
        (GgmlType::Q5_0, false) => |w, x| w.map(|r| scalar::dot_q5_0(r, x)),
        (GgmlType::Q5_1, false) => |w, x| w.map(|r| scalar::dot_q5_1(r, x)),
        _ => |w, x| w.map(|r| scalar::dot_q8_0(r, x)),
    };
    Some(DotKernels { one, four, rows4 })
}

fn scalar_four(one: DotFn, w: &[u8], x: &[Q8Block], stride: usize) -> [f32; 4] {
    std::array::from_fn(|j| one(w, &x[j * stride..(j + 1) * stride]))
}

/// The fastest available dot kernel for a weight type, or `None` when the
/// type has no integer kernel (the caller then dequantizes rows instead).
pub fn dot_kernel(dtype: GgmlType) -> Option<DotFn> {
    let avx2 = has_avx2();
    match dtype {
        GgmlType::Q4_0 => Some(if avx2 { avx2::dot_q4_0 } else { scalar::dot_q4_0 }),
        GgmlType::Q4_1 => Some(if avx2 { avx2::dot_q4_1 } else { scalar::dot_q4_1 }),
        GgmlType::Q8_0 => Some(if avx2 { avx2::dot_q8_0 } else { scalar::dot_q8_0 }),
        GgmlType::Q5_0 => Some(if avx2 { avx2::dot_q5_0 } else { scalar::dot_q5_0 }),
        GgmlType::Q5_1 => Some(if avx2 { avx2::dot_q5_1 } else { scalar::dot_q5_1 }),
        _ => None,
    }
}

/// The scalar kernel for a type (for tests and CPUs without AVX2).
pub fn scalar_dot_kernel(dtype: GgmlType) -> Option<DotFn> {
    match dtype {
        GgmlType::Q4_0 => Some(scalar::dot_q4_0),
        GgmlType::Q4_1 => Some(scalar::dot_q4_1),
        GgmlType::Q8_0 => Some(scalar::dot_q8_0),
        GgmlType::Q5_0 => Some(scalar::dot_q5_0),
        GgmlType::Q5_1 => Some(scalar::dot_q5_1),
        _ => None,
    }
}

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// Portable reference kernels.
///
/// Every kernel (these, the AVX2 ones below and the grouped prefill kernels in
/// `gemm`) computes per block the exact integer `Σ u·q − o·Σq` and folds it as
/// `acc = fma(d_w·d_x, isum, acc)` then, for Q4_1, `acc = fma(s_x, m_w, acc)`:
/// the same IEEE operations in the same order, so a token's result is
/// bit-identical whichever kernel (batch size) computed it.
mod scalar {
    use super::{f16_at, Q8Block};

    fn nibble_dot(q: &[u8], xb: &Q8Block) -> i32 {
        (0..16).map(|j| (q[j] & 0x0F) as i32 * xb.qs[j] as i32 + (q[j] >> 4) as i32 * xb.qs[j + 16] as i32).sum()
    }

    pub fn dot_q4_0(w: &[u8], x: &[Q8Block]) -> f32 {
        let mut acc = 0f32;
        for (wb, xb) in w.chunks_exact(18).zip(x) {
            let isum = nibble_dot(&wb[2..18], xb) - 8 * xb.qsum;
            acc = (xb.d * f16_at(wb, 0)).mul_add(isum as f32, acc);
        }
        acc
    }

    pub fn dot_q4_1(w: &[u8], x: &[Q8Block]) -> f32 {
        let mut acc = 0f32;
        for (wb, xb) in w.chunks_exact(20).zip(x) {
            let isum = nibble_dot(&wb[4..20], xb);
            acc = (xb.d * f16_at(wb, 0)).mul_add(isum as f32, acc);
            acc = xb.s.mul_add(f16_at(wb, 2), acc);
        }
        acc
    }

    /// Σ u·q over a Q5 block's 32 unsigned values (`qh` at `h`, nibbles after it).
    fn q5_dot(wb: &[u8], h: usize, xb: &Q8Block) -> i32 {
        let qh = u32::from_le_bytes([wb[h], wb[h + 1], wb[h + 2], wb[h + 3]]);
        let q = &wb[h + 4..h + 20];
        (0..16)
            .map(|j| {
                let lo = (q[j] & 0x0F) as i32 | (((qh >> j) & 1) << 4) as i32;
                let hi = (q[j] >> 4) as i32 | (((qh >> (j + 16)) & 1) << 4) as i32;
                lo * xb.qs[j] as i32 + hi * xb.qs[j + 16] as i32
            })
            .sum()
    }

    pub fn dot_q5_0(w: &[u8], x: &[Q8Block]) -> f32 {
        let mut acc = 0f32;
        for (wb, xb) in w.chunks_exact(22).zip(x) {
            let isum = q5_dot(wb, 2, xb) - 16 * xb.qsum;
            acc = (xb.d * f16_at(wb, 0)).mul_add(isum as f32, acc);
        }
        acc
    }

    pub fn dot_q5_1(w: &[u8], x: &[Q8Block]) -> f32 {
        let mut acc = 0f32;
        for (wb, xb) in w.chunks_exact(24).zip(x) {
            let isum = q5_dot(wb, 4, xb);
            acc = (xb.d * f16_at(wb, 0)).mul_add(isum as f32, acc);
            acc = xb.s.mul_add(f16_at(wb, 2), acc);
        }
        acc
    }

    pub fn dot_q8_0(w: &[u8], x: &[Q8Block]) -> f32 {
        let mut acc = 0f32;
        for (wb, xb) in w.chunks_exact(34).zip(x) {
            let isum: i32 = (0..32).map(|j| (wb[2 + j] as i8) as i32 * xb.qs[j] as i32).sum();
            acc = (xb.d * f16_at(wb, 0)).mul_add(isum as f32, acc);
        }
        acc
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::unpack_q5;

/// AVX2 + FMA + F16C kernels (selected at run time).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::Q8Block;
    use std::arch::x86_64::*;

    #[derive(Clone, Copy, PartialEq)]
    #[repr(u8)]
    enum Kind {
        Q4_0,
        Q4_1,
        Q5_0,
        Q5_1,
        Q8_0,
    }

    impl Kind {
        const fn bytes(self) -> usize {
            match self {
                Self::Q4_0 => 18,
                Self::Q4_1 => 20,
                Self::Q5_0 => 22,
                Self::Q5_1 => 24,
                Self::Q8_0 => 34,
            }
        }

        /// The offset subtracted from the unsigned values (× Σq).
        const fn offset(self) -> i32 {
            match self {
                Self::Q4_0 => 8,
                Self::Q5_0 => 16,
                _ => 0,
            }
        }

        /// Whether the block has a min (`+ m · s`).
        const fn has_min(self) -> bool {
            matches!(self, Self::Q4_1 | Self::Q5_1)
        }
    }

    /// A block's 32 unsigned values (Q8_0: its signed bytes), its d and its m.
    #[inline(always)]
    unsafe fn unpack(wb: *const u8, kind: Kind) -> (__m256i, f32, f32) {
        // SAFETY: the caller guarantees a whole block of `kind` at wb.
        unsafe {
            match kind {
                Kind::Q4_0 => (unpack_nibbles(wb.add(2)), half(wb), 0.0),
                Kind::Q4_1 => (unpack_nibbles(wb.add(4)), half(wb), half(wb.add(2))),
                Kind::Q5_0 => (unpack_q5(wb.add(2)), half(wb), 0.0),
                Kind::Q5_1 => (unpack_q5(wb.add(4)), half(wb), half(wb.add(2))),
                Kind::Q8_0 => (_mm256_loadu_si256(wb.add(2) as *const __m256i), half(wb), 0.0),
            }
        }
    }

    /// A Q5 block's `qh` (4 bytes) and 16 nibble bytes at p -> 32 unsigned 5-bit bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn unpack_q5(p: *const u8) -> __m256i {
        // SAFETY: the caller guarantees 20 readable bytes at p.
        unsafe {
            let qh = std::ptr::read_unaligned(p as *const u32);
            // Byte j of the result gets 0x10 when bit j of qh is set.
            let spread = _mm256_shuffle_epi8(
                _mm256_set1_epi32(qh as i32),
                _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0),
            );
            let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
            let high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
            _mm256_or_si256(unpack_nibbles(p.add(4)), high)
        }
    }

    macro_rules! entries {
        ($one:ident, $four:ident, $kind:expr) => {
            pub fn $one(w: &[u8], x: &[Q8Block]) -> f32 {
                let n = x.len().min(w.len() / $kind.bytes());
                // SAFETY: selected only when avx2/fma/f16c were detected; n bounds every block read.
                unsafe { rows::<1>(w.as_ptr(), x.as_ptr(), 0, n, $kind)[0] }
            }

            pub fn $four(w: &[u8], x: &[Q8Block], stride: usize) -> [f32; 4] {
                let n = stride.min(w.len() / $kind.bytes());
                assert!(x.len() >= 3 * stride + n, "dot4: activation rows too short");
                const K: u8 = $kind as u8;
                let ahead = w.as_ptr().wrapping_add(2 * w.len());
                // SAFETY: as above; 4 rows of >= n blocks at `stride` in x.
                unsafe { tokens4::<K>(w.as_ptr(), x.as_ptr(), stride, n, ahead) }
            }
        };
    }
    entries!(dot_q4_0, dot4_q4_0, Kind::Q4_0);
    entries!(dot_q4_1, dot4_q4_1, Kind::Q4_1);
    entries!(dot_q8_0, dot4_q8_0, Kind::Q8_0);
    entries!(dot_q5_0, dot4_q5_0, Kind::Q5_0);
    entries!(dot_q5_1, dot4_q5_1, Kind::Q5_1);

    macro_rules! rows4_entry {
        ($name:ident, $kind:expr) => {
            pub fn $name(w: [&[u8]; 4], x: &[Q8Block]) -> [f32; 4] {
                const K: u8 = $kind as u8;
                let n = w.iter().fold(x.len(), |n, r| n.min(r.len() / kind_of(K).bytes()));
                let ahead = w[3].as_ptr().wrapping_add(5 * w[3].len());
                // SAFETY: features detected; n blocks in each of the 4 rows and in x.
                unsafe { rows4::<K>(w.map(|r| r.as_ptr()), x.as_ptr(), n, ahead) }
            }
        };
    }
    rows4_entry!(rows4_q4_0, Kind::Q4_0);
    rows4_entry!(rows4_q4_1, Kind::Q4_1);
    rows4_entry!(rows4_q8_0, Kind::Q8_0);
    rows4_entry!(rows4_q5_0, Kind::Q5_0);
    rows4_entry!(rows4_q5_1, Kind::Q5_1);

    /// One weight row against four token rows `stride` blocks apart; lane j
    /// of every vector is token j, and each lane performs exactly the scalar
    /// kernels' operations. The row after next (from `ahead` on) is
    /// prefetched, as in [`rows4`].
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tokens4<const K: u8>(w: *const u8, x: *const Q8Block, stride: usize, n: usize, ahead: *const u8) -> [f32; 4] {
        let kind = kind_of(K);
        let ones = _mm256_set1_epi16(1);
        let mut acc = _mm_setzero_ps();
        for b in 0..n {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(b * kind.bytes()) as *const i8);
            // SAFETY: b < n blocks of w; x rows j*stride + b are in bounds (callers check).
            unsafe {
                let (u, d, m) = unpack(w.add(b * kind.bytes()), kind);
                let uw = if kind == Kind::Q8_0 { _mm256_sign_epi8(u, u) } else { u };
                let xs: [&Q8Block; 4] = std::array::from_fn(|j| &*x.add(j * stride + b));
                let mut sums = [_mm256_setzero_si256(); 4];
                for j in 0..4 {
                    let mut q8 = _mm256_loadu_si256(xs[j].qs.as_ptr() as *const __m256i);
                    if kind == Kind::Q8_0 {
                        q8 = _mm256_sign_epi8(q8, u);
                    }
                    sums[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(uw, q8), ones);
                }
                let mut isum = reduce4(sums);
                if kind.offset() != 0 {
                    let off = |j: usize| kind.offset() * xs[j].qsum;
                    isum = _mm_sub_epi32(isum, _mm_set_epi32(off(3), off(2), off(1), off(0)));
                }
                let xd = _mm_set_ps(xs[3].d, xs[2].d, xs[1].d, xs[0].d);
                acc = _mm_fmadd_ps(_mm_mul_ps(xd, _mm_set1_ps(d)), _mm_cvtepi32_ps(isum), acc);
                if kind.has_min() {
                    acc = _mm_fmadd_ps(_mm_set_ps(xs[3].s, xs[2].s, xs[1].s, xs[0].s), _mm_set1_ps(m), acc);
                }
            }
        }
        let mut out = [0f32; 4];
        // SAFETY: out has 4 floats.
        unsafe { _mm_storeu_ps(out.as_mut_ptr(), acc) };
        out
    }

    /// Exact i32 sums of four vectors' 8 lanes each, vector i into lane i.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn reduce4(sums: [__m256i; 4]) -> __m128i {
        let h01 = _mm256_hadd_epi32(sums[0], sums[1]);
        let h23 = _mm256_hadd_epi32(sums[2], sums[3]);
        let h = _mm256_hadd_epi32(h01, h23);
        _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1))
    }

    /// The kind with discriminant `k` (a const generic stands in for the enum).
    const fn kind_of(k: u8) -> Kind {
        match k {
            0 => Kind::Q4_0,
            1 => Kind::Q4_1,
            2 => Kind::Q5_0,
            3 => Kind::Q5_1,
            _ => Kind::Q8_0,
        }
    }

    /// The f16 field at byte `at` of four blocks, as four f32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn halves4(p: [*const u8; 4], at: usize) -> __m128 {
        // SAFETY: the caller guarantees two readable bytes at p[r] + at.
        let h = |r: usize| unsafe { std::ptr::read_unaligned(p[r].add(at) as *const u16) } as i16;
        _mm_cvtph_ps(_mm_set_epi16(0, 0, 0, 0, h(3), h(2), h(1), h(0)))
    }

    /// Four weight rows against one token; lane r of every vector is row r, and
    /// each lane performs exactly the scalar kernels' operations.
    ///
    /// The rows of a matrix lie one after another, so while these four are
    /// read, the four after the next four (from `ahead` on) are prefetched:
    /// a hint only, never dereferenced. Without it the loads of short rows
    /// (576 values) waited on memory and SmolLM2 decoded at 55-62 tok/s
    /// instead of 85-113 on 2 threads; two groups ahead measured ~8% faster
    /// than one, four no better than two.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn rows4<const K: u8>(w: [*const u8; 4], x: *const Q8Block, n: usize, ahead: *const u8) -> [f32; 4] {
        let kind = kind_of(K);
        let step = 4 * kind.bytes();
        let ones = _mm256_set1_epi16(1);
        let mut acc = _mm_setzero_ps();
        for b in 0..n {
            let next = ahead.wrapping_add(b * step);
            for line in (0..step).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(line) as *const i8);
            }
            // SAFETY: b < n blocks in every row and in x (see `rows4_entry!`).
            unsafe {
                let xb = &*x.add(b);
                let q8 = _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
                let blocks = w.map(|r| r.add(b * kind.bytes()));
                let mut sums = [_mm256_setzero_si256(); 4];
                for r in 0..4 {
                    let (u, _, _) = unpack(blocks[r], kind);
                    let (u, x8) = if kind == Kind::Q8_0 { (_mm256_sign_epi8(u, u), _mm256_sign_epi8(q8, u)) } else { (u, q8) };
                    sums[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(u, x8), ones);
                }
                let mut isum = reduce4(sums);
                if kind.offset() != 0 {
                    isum = _mm_sub_epi32(isum, _mm_set1_epi32(kind.offset() * xb.qsum));
                }
                let dw = halves4(blocks, 0);
                acc = _mm_fmadd_ps(_mm_mul_ps(_mm_set1_ps(xb.d), dw), _mm_cvtepi32_ps(isum), acc);
                if kind.has_min() {
                    acc = _mm_fmadd_ps(_mm_set1_ps(xb.s), halves4(blocks, 2), acc);
                }
            }
        }
        let mut out = [0f32; 4];
        // SAFETY: out has 4 floats.
        unsafe { _mm_storeu_ps(out.as_mut_ptr(), acc) };
        out
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn half(p: *const u8) -> f32 {
        // SAFETY: the caller guarantees two readable bytes at p.
        let bits = unsafe { std::ptr::read_unaligned(p as *const u16) };
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum_i32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }

    /// 16 packed nibble bytes -> 32 unsigned bytes (low nibbles first).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_nibbles(p: *const u8) -> __m256i {
        // SAFETY: the caller guarantees 16 readable bytes at p.
        let q = unsafe { _mm_loadu_si128(p as *const __m128i) };
        let mask = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(q, mask);
        let hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
        _mm256_set_m128i(hi, lo)
    }

    /// One weight row against `R` token rows `stride` blocks apart.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn rows<const R: usize>(w: *const u8, x: *const Q8Block, stride: usize, n: usize, kind: Kind) -> [f32; R] {
        let mut acc = [0f32; R];
        let ones = _mm256_set1_epi16(1);
        for b in 0..n {
            // SAFETY: b < n blocks of w; x rows j*stride + b are in bounds (callers check).
            unsafe {
                let (u, d, m) = unpack(w.add(b * kind.bytes()), kind);
                let uw = if kind == Kind::Q8_0 { _mm256_sign_epi8(u, u) } else { u };
                for (j, acc) in acc.iter_mut().enumerate() {
                    let xb = &*x.add(j * stride + b);
                    let mut q8 = _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
                    if kind == Kind::Q8_0 {
                        q8 = _mm256_sign_epi8(q8, u);
                    }
                    let mut isum = hsum_i32(_mm256_madd_epi16(_mm256_maddubs_epi16(uw, q8), ones));
                    isum -= kind.offset() * xb.qsum;
                    *acc = (xb.d * d).mul_add(isum as f32, *acc);
                    if kind.has_min() {
                        *acc = xb.s.mul_add(m, *acc);
                    }
                }
            }
        }
        acc
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod avx2 {
    pub use super::scalar::{dot_q4_0, dot_q4_1, dot_q5_0, dot_q5_1, dot_q8_0};
    use super::{scalar, scalar_four, Q8Block};
    pub fn dot4_q4_0(w: &[u8], x: &[Q8Block], s: usize) -> [f32; 4] {
        scalar_four(scalar::dot_q4_0, w, x, s)
    }
    pub fn dot4_q4_1(w: &[u8], x: &[Q8Block], s: usize) -> [f32; 4] {
        scalar_four(scalar::dot_q4_1, w, x, s)
    }
    pub fn dot4_q8_0(w: &[u8], x: &[Q8Block], s: usize) -> [f32; 4] {
        scalar_four(scalar::dot_q8_0, w, x, s)
    }
    pub fn rows4_q4_0(w: [&[u8]; 4], x: &[Q8Block]) -> [f32; 4] {
        w.map(|r| scalar::dot_q4_0(r, x))
    }
    pub fn rows4_q4_1(w: [&[u8]; 4], x: &[Q8Block]) -> [f32; 4] {
        w.map(|r| scalar::dot_q4_1(r, x))
    }
    pub fn rows4_q8_0(w: [&[u8]; 4], x: &[Q8Block]) -> [f32; 4] {
        w.map(|r| scalar::dot_q8_0(r, x))
    }
    pub fn dot4_q5_0(w: &[u8], x: &[Q8Block], s: usize) -> [f32; 4] {
        scalar_four(scalar::dot_q5_0, w, x, s)
    }
    pub fn dot4_q5_1(w: &[u8], x: &[Q8Block], s: usize) -> [f32; 4] {
        scalar_four(scalar::dot_q5_1, w, x, s)
    }
    pub fn rows4_q5_0(w: [&[u8]; 4], x: &[Q8Block]) -> [f32; 4] {
        w.map(|r| scalar::dot_q5_0(r, x))
    }
    pub fn rows4_q5_1(w: [&[u8]; 4], x: &[Q8Block]) -> [f32; 4] {
        w.map(|r| scalar::dot_q5_1(r, x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    fn random_blocks(dtype: GgmlType, nblocks: usize, seed: &mut u64) -> Vec<u8> {
        let ts = dtype.type_size();
        let mut out = vec![0u8; nblocks * ts];
        for b in out.chunks_exact_mut(ts) {
            for byte in b.iter_mut() {
                *byte = lcg(seed) as u8;
            }
            let scale = half::f16::from_f32(0.01 + (lcg(seed) % 100) as f32 / 1000.0).to_bits();
            b[0..2].copy_from_slice(&scale.to_le_bytes());
            if matches!(dtype, GgmlType::Q4_1 | GgmlType::Q5_1) {
                let min = half::f16::from_f32(-0.05).to_bits();
                b[2..4].copy_from_slice(&min.to_le_bytes());
            }
        }
        out
    }

    fn dequant(dtype: GgmlType, w: &[u8]) -> Vec<f32> {
        if matches!(dtype, GgmlType::Q5_0 | GgmlType::Q5_1) {
            return crate::quant::dequant::dequantize_to_vec(dtype, w).expect("dequantize");
        }
        let mut out = Vec::new();
        for b in w.chunks_exact(dtype.type_size()) {
            let d = f16_at(b, 0);
            match dtype {
                GgmlType::Q4_0 => {
                    let vals: Vec<f32> = (0..32)
                        .map(|j| {
                            let byte = b[2 + j % 16];
                            let q = if j < 16 { byte & 15 } else { byte >> 4 };
                            (q as f32 - 8.0) * d
                        })
                        .collect();
                    out.extend(vals);
                }
                GgmlType::Q4_1 => {
                    let m = f16_at(b, 2);
                    out.extend((0..32).map(|j| {
                        let byte = b[4 + j % 16];
                        let q = if j < 16 { byte & 15 } else { byte >> 4 };
                        q as f32 * d + m
                    }));
                }
                _ => out.extend((0..32).map(|j| (b[2 + j] as i8) as f32 * d)),
            }
        }
        out
    }

    #[test]
    fn kernels_match_dequantized_dot() {
        let mut seed = 7u64;
        let n = 576;
        let x: Vec<f32> = (0..n).map(|_| (lcg(&mut seed) % 2000) as f32 / 1000.0 - 1.0).collect();
        let mut xq = vec![Q8Block::default(); n / QK];
        quantize_row_q8(&x, &mut xq);
        for dtype in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0] {
            let w = random_blocks(dtype, n / QK, &mut seed);
            let wf = dequant(dtype, &w);
            let exact: f32 = wf.iter().zip(&x).map(|(a, b)| a * b).sum();
            let magnitude: f32 = wf.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
            let fast = dot_kernel(dtype).map(|k| k(&w, &xq));
            let slow = scalar_dot_kernel(dtype).map(|k| k(&w, &xq));
            let (Some(fast), Some(slow)) = (fast, slow) else { panic!("no kernel for {dtype:?}") };
            assert_eq!(fast.to_bits(), slow.to_bits(), "{dtype:?}: SIMD {fast} vs scalar {slow} must be bit-identical");
            // 8-bit activations: the error is a small fraction of the summed magnitudes.
            assert!((slow - exact).abs() <= 1e-2 * magnitude, "{dtype:?}: {slow} vs {exact} (magnitude {magnitude})");
        }
    }

    #[test]
    fn four_token_kernels_match_single_token_kernels() {
        let mut seed = 11u64;
        let n = 256;
        let x: Vec<f32> = (0..4 * n).map(|_| (lcg(&mut seed) % 2000) as f32 / 500.0 - 2.0).collect();
        let mut xq = vec![Q8Block::default(); 4 * n / QK];
        quantize_row_q8(&x, &mut xq);
        let nb = n / QK;
        for dtype in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0] {
            let w = random_blocks(dtype, nb, &mut seed);
            let k = dot_kernels(dtype).expect("kernels");
            let four = (k.four)(&w, &xq, nb);
            for (j, got) in four.iter().enumerate() {
                let one = (k.one)(&w, &xq[j * nb..(j + 1) * nb]);
                assert_eq!(got.to_bits(), one.to_bits(), "{dtype:?} token {j}: {got} vs {one}");
            }
            let rows: Vec<Vec<u8>> = (0..4).map(|_| random_blocks(dtype, nb, &mut seed)).collect();
            let by_rows = (k.rows4)([&rows[0], &rows[1], &rows[2], &rows[3]], &xq[..nb]);
            for (r, got) in by_rows.iter().enumerate() {
                let one = (k.one)(&rows[r], &xq[..nb]);
                assert_eq!(got.to_bits(), one.to_bits(), "{dtype:?} row {r}: {got} vs {one}");
            }
        }
    }

    #[test]
    fn round_half_away_equals_f32_round() {
        let mut seed = 3u64;
        for i in 0..200_000u32 {
            let x = match i % 4 {
                0 => (lcg(&mut seed) % 2_000_000) as f32 / 7_873.0 - 127.0,
                1 => (i as f32) * 0.5 - 127.0,
                2 => f32::from_bits(lcg(&mut seed) % 0x42ff_0000),
                _ => -f32::from_bits(lcg(&mut seed) % 0x42ff_0000),
            };
            assert_eq!(round_half_away(x), x.round() as i32, "x = {x:e}");
        }
    }

    #[test]
    fn quantize_round_trips_within_half_a_step() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) * 0.37).collect();
        let mut q = vec![Q8Block::default(); 2];
        quantize_row_q8(&x, &mut q);
        for (i, v) in x.iter().enumerate() {
            let b = &q[i / 32];
            assert!((b.qs[i % 32] as f32 * b.d - v).abs() <= b.d * 0.5 + 1e-6);
        }
        let zero = vec![0f32; 32];
        quantize_row_q8(&zero, &mut q[..1]);
        assert_eq!(q[0].d, 0.0);
    }
}
