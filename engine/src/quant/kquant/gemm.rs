//! Prefill GEMM for K-quant weights: 16 tokens per AVX-512 register.
//!
//! Like the grouped kernel for 32-value blocks (`quant::gemm`), activations
//! of 16 tokens are interleaved ([`Q8KGroup`]) so that each i32 lane of a
//! `vpdpbusd` accumulates one token, while 4 unsigned weight bytes are
//! broadcast. Each run of `SUB` values (one integer scale) is multiplied by
//! its scale in i32 (`vpmulld`); Q6_K's −32 offset is each run's starting
//! value (−32 times the run's activation sum), the mins come from the
//! interleaved group sums, and the floats are folded per token exactly as the
//! one-token kernels fold them, so every lane is bit-identical to
//! [`super::KDotKernels::one`] for that token.

#[cfg(target_arch = "x86_64")]
use super::avx2::{Format, Q4K, Q5K, Q6K};
use super::{Q8KBlock, QK_K};
use crate::gguf::types::GgmlType;
use crate::quant::gemm::GROUP;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// One super-block (256 values) of 16 tokens' activations, interleaved.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Q8KGroup {
    /// `qs[k][t]`: values `4k..4k+4` of token `t`.
    pub qs: [[[i8; 4]; GROUP]; QK_K / 4],
    /// `bsums[g][t]`: the sum of token `t`'s values `16g..16g+16`.
    pub bsums: [[i32; GROUP]; 16],
    /// `pairs[p][t]`: the sums of token `t`'s 32-value sub-blocks `2p` (low
    /// i16) and `2p + 1` (high i16), for the mins (`vpdpwssd`).
    pub pairs: [[i32; GROUP]; 4],
    /// Scales per token.
    pub d: [f32; GROUP],
}

impl Default for Q8KGroup {
    fn default() -> Self {
        Self { qs: [[[0; 4]; GROUP]; QK_K / 4], bsums: [[0; GROUP]; 16], pairs: [[0; GROUP]; 4], d: [0.0; GROUP] }
    }
}

/// Interleave `n` tokens' rows (`nb` super-blocks each, token-major) into
/// groups of 16 (`n.div_ceil(16) * nb` groups, group-major); missing tokens are zero.
pub fn interleave_k(xq: &[Q8KBlock], n: usize, nb: usize) -> Vec<Q8KGroup> {
    let mut out = vec![Q8KGroup::default(); n.div_ceil(GROUP) * nb];
    crate::quant::gemm::for_each_group(&mut out, nb, n, |dst, lane, t| {
        for (b, dst) in dst.iter_mut().enumerate() {
            let src = &xq[t * nb + b];
            dst.d[lane] = src.d;
            for (k, chunk) in src.qs.chunks_exact(4).enumerate() {
                dst.qs[k][lane].copy_from_slice(chunk);
            }
            for (s, sums) in src.bsums.iter().zip(dst.bsums.iter_mut()) {
                sums[lane] = *s as i32;
            }
            for (p, pair) in dst.pairs.iter_mut().enumerate() {
                pair[lane] = pack_i16(sub_block_sum(&src.bsums, 2 * p), sub_block_sum(&src.bsums, 2 * p + 1));
            }
        }
    });
    out
}

/// The sum of 32-value sub-block `j` (|·| <= 32 * 128, an i16).
fn sub_block_sum(bsums: &[i16; 16], j: usize) -> i16 {
    bsums[2 * j] + bsums[2 * j + 1]
}

/// `lo` in the low 16 bits, `hi` in the high 16 (one `vpdpwssd` lane).
pub(super) fn pack_i16(lo: i16, hi: i16) -> i32 {
    (lo as u16 as u32 | (hi as u16 as u32) << 16) as i32
}

/// Bytes of activations the VNNI kernels should be given at a time, to keep
/// them in each core's L2 (every block of 4 rows reads them all; 512 KiB
/// leaves room for the weights on CPUs with 1 MiB of L2).
const KGROUPS_L2_BYTES: usize = 512 * 1024;

/// Groups of 16 tokens (`nb` super-blocks each) whose activations fit
/// [`KGROUPS_L2_BYTES`]: how many to give the VNNI kernels at a time; at
/// least 2, their pair of groups sharing each weight word.
pub fn groups_in_l2(nb: usize) -> usize {
    (KGROUPS_L2_BYTES / (nb.max(1) * std::mem::size_of::<Q8KGroup>())).max(2)
}

/// Super-blocks of `groups` groups' activations that fit
/// [`KGROUPS_L2_BYTES`] (at least 1): the range of a row the VNNI kernels
/// should take at a time for that many groups ([`KGemmRows4AccFn`]).
pub fn super_blocks_in_l2(groups: usize) -> usize {
    (KGROUPS_L2_BYTES / (groups.max(1) * std::mem::size_of::<Q8KGroup>())).max(1)
}

/// Four weight rows times every group of 16 tokens: `x` holds the groups
/// group-major (`nb` super-blocks each), `out[g][r]` receives row `r`'s
/// results for group `g` (`out.len()` groups). Each weight super-block is
/// unpacked once for all groups.
pub type KGemmRows4Fn = fn([&[u8]; 4], &[Q8KGroup], usize, &mut [[[f32; GROUP]; 4]]);

/// [`KGemmRows4Fn`] over a range of super-blocks, adding to `out`:
/// `(rows, x, stride, nb, out)`, the rows starting at the range's first
/// super-block, `x[g * stride + b]` super-block `b` of the range for group
/// `g`, `nb` super-blocks. Called on consecutive ranges with `out` zeroed
/// first, the results are [`KGemmRows4Fn`]'s bit for bit (the same
/// operations in the same order). With one group the kernel prefetches the
/// rows 4 ahead as if a row were `stride` super-blocks long (the engine's
/// layers; elsewhere a useless hint).
pub type KGemmRows4AccFn = fn([&[u8]; 4], &[Q8KGroup], usize, usize, &mut [[[f32; GROUP]; 4]]);

/// One weight row times every group (as [`KGemmRows4Fn`], one row).
pub type KGemmFn = fn(&[u8], &[Q8KGroup], usize, &mut [[[f32; GROUP]; 1]]);

/// The grouped kernels for one K-quant type.
#[derive(Clone, Copy)]
pub struct KGemmKernels {
    /// One row.
    pub one: KGemmFn,
    /// Four rows sharing each activation load.
    pub rows4: KGemmRows4Fn,
    /// `rows4` over a range of super-blocks, accumulating.
    pub rows4_acc: KGemmRows4AccFn,
    /// 16 rows on AMX tiles, where the CPU and OS have them (bit-identical to `rows4`).
    #[cfg(target_arch = "x86_64")]
    pub amx: Option<super::amx::KGemmAmxFn>,
    /// Groups of 16 tokens from which `amx` is faster than `rows4`.
    #[cfg(target_arch = "x86_64")]
    pub amx_min_groups: usize,
}

/// The grouped kernels for a K-quant type, where this CPU has AVX-512 VNNI.
#[cfg(not(target_arch = "x86_64"))]
pub fn kgemm_kernels(_dtype: GgmlType) -> Option<KGemmKernels> {
    None
}

/// The grouped kernels for a K-quant type, where this CPU has AVX-512 VNNI.
#[cfg(target_arch = "x86_64")]
pub fn kgemm_kernels(dtype: GgmlType) -> Option<KGemmKernels> {
    let vnni = std::is_x86_feature_detected!("avx512vnni")
        && std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512bw")
        && super::avx2::available();
    if !vnni {
        return None;
    }
    macro_rules! kernels {
        ($fmt:ty) => {
            KGemmKernels {
                one: |w, x, nb, out| {
                    check(&[w], x, nb, out.len(), <$fmt>::BYTES);
                    zero(out);
                    // SAFETY: AVX-512 VNNI/BW/F and AVX2/FMA/F16C were detected above; shapes checked.
                    unsafe { vnni_rows::<$fmt, 1>([w], x, nb, nb, out) }
                },
                rows4: |w, x, nb, out| {
                    check(&w, x, nb, out.len(), <$fmt>::BYTES);
                    zero(out);
                    // SAFETY: as above.
                    unsafe { vnni_rows::<$fmt, 4>(w, x, nb, nb, out) }
                },
                rows4_acc: |w, x, stride, nb, out| {
                    check_strided(&w, x, stride, nb, out.len(), <$fmt>::BYTES);
                    // SAFETY: as above.
                    unsafe { vnni_rows::<$fmt, 4>(w, x, stride, nb, out) }
                },
                amx: super::amx::amx_kernel(dtype),
                amx_min_groups: super::amx::min_groups(dtype),
            }
        };
    }
    match dtype {
        GgmlType::Q4K => Some(kernels!(Q4K)),
        GgmlType::Q5K => Some(kernels!(Q5K)),
        GgmlType::Q6K => Some(kernels!(Q6K)),
        _ => None,
    }
}

/// The kernels' shape contract: `nb` super-blocks in every row, `groups * nb` groups.
#[cfg(target_arch = "x86_64")]
pub(super) fn check(w: &[&[u8]], x: &[Q8KGroup], nb: usize, groups: usize, bytes: usize) {
    check_strided(w, x, nb, nb, groups, bytes);
}

/// [`check`] with groups `stride` super-blocks apart.
#[cfg(target_arch = "x86_64")]
fn check_strided(w: &[&[u8]], x: &[Q8KGroup], stride: usize, nb: usize, groups: usize, bytes: usize) {
    let row_bytes = nb.checked_mul(bytes);
    assert!(w.iter().all(|r| row_bytes.is_some_and(|b| r.len() >= b)), "K-quant GEMM: weight row shorter than {nb} super-blocks");
    assert!(nb <= stride, "K-quant GEMM: {nb} super-blocks of groups {stride} apart");
    let need = groups.checked_sub(1).map_or(Some(0), |g| g.checked_mul(stride).and_then(|at| at.checked_add(nb)));
    assert!(need.is_some_and(|need| x.len() >= need), "K-quant GEMM: {} activation groups for {groups} x {nb} (stride {stride})", x.len());
}

/// Zeroes a kernel's results before a whole row.
#[cfg(target_arch = "x86_64")]
fn zero<const R: usize>(out: &mut [[[f32; GROUP]; R]]) {
    for o in out.iter_mut() {
        *o = [[0.0; GROUP]; R];
    }
}

/// One row's super-block, unpacked: 256 unsigned values, the integer scale
/// of each run of `SUB` values, the mins (packed in i16 pairs, as
/// [`Q8KGroup::pairs`]), d and dmin.
#[cfg(target_arch = "x86_64")]
#[repr(C, align(32))]
pub(super) struct Unpacked {
    pub(super) u: [u8; QK_K],
    pub(super) scales: [i32; 16],
    pub(super) mins: [i32; 4],
    pub(super) d: (f32, f32),
}

#[cfg(target_arch = "x86_64")]
impl Unpacked {
    const ZERO: Self = Self { u: [0; QK_K], scales: [0; 16], mins: [0; 4], d: (0.0, 0.0) };
}

/// The most rows [`vnni_rows`] unpacks at a time.
#[cfg(target_arch = "x86_64")]
const MAX_ROWS: usize = 4;

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// Each thread's unpacked rows for [`vnni_rows`]. Made once per thread:
    /// zeroing (or building and copying) 1.4 KiB on every call cost 1-6%
    /// of the one-group kernel on 1536-column rows, which it calls every 4 rows.
    static UNPACKED: std::cell::UnsafeCell<[Unpacked; MAX_ROWS]> = const { std::cell::UnsafeCell::new([const { Unpacked::ZERO }; MAX_ROWS]) };
}

/// Unpacks one row's super-block `wb` into `row`: its 256 unsigned values,
/// integer scales, packed mins, d and dmin.
///
/// # Safety
/// `wb` must be one whole super-block of `F`; the caller must have AVX2,
/// F16C and AVX-512F/BW enabled (this is inlined into it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn unpack_row<F: GroupedValues>(wb: &[u8], row: &mut Unpacked) {
    // SAFETY: wb is one whole super-block (of Q4_K/Q5_K where F::MINS);
    // AVX2, F16C and AVX-512F/BW enabled in the caller.
    unsafe {
        F::unpack_values(wb.as_ptr(), &mut row.u);
        if F::MINS {
            k4_scales_d::<F>(wb, row);
        } else {
            row.d = F::d(wb.as_ptr());
            (row.scales, _) = F::int_scales(wb);
        }
    }
}

/// How the grouped kernels unpack a format's 256 values, in order, into
/// [`Unpacked::u`].
#[cfg(target_arch = "x86_64")]
trait GroupedValues: Format {
    /// Writes the super-block's 256 unsigned values in order to `u`.
    ///
    /// # Safety
    /// `wb` must be one whole super-block; the caller must have AVX2 and
    /// AVX-512F/BW enabled (this is inlined into it).
    unsafe fn unpack_values(wb: *const u8, u: &mut [u8; QK_K]);
}

#[cfg(target_arch = "x86_64")]
impl GroupedValues for Q4K {
    /// Two 64-byte loads: each gives 128 values as low nibbles (values
    /// 0..32 and 64..96 of the 128) and high nibbles (32..64, 96..128), put
    /// in order by two lane shuffles (half the instructions of eight 32-byte
    /// registers).
    #[inline(always)]
    unsafe fn unpack_values(wb: *const u8, u: &mut [u8; QK_K]) {
        // SAFETY: bytes 16..144 of the super-block are readable, u holds 256
        // bytes; AVX-512F/BW enabled in the caller.
        unsafe {
            let mask = _mm512_set1_epi8(0x0F);
            for h in 0..2 {
                let q = _mm512_loadu_si512(wb.add(16 + 64 * h) as *const __m512i);
                let lo = _mm512_and_si512(q, mask);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), mask);
                let out = u.as_mut_ptr().add(128 * h) as *mut __m512i;
                _mm512_storeu_si512(out, _mm512_shuffle_i64x2::<0b01_00_01_00>(lo, hi));
                _mm512_storeu_si512(out.add(1), _mm512_shuffle_i64x2::<0b11_10_11_10>(lo, hi));
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl GroupedValues for Q5K {
    /// Eight 32-byte registers (its fifth bits come from `qh`).
    #[inline(always)]
    unsafe fn unpack_values(wb: *const u8, u: &mut [u8; QK_K]) {
        // SAFETY: wb is a whole super-block, u holds 8 registers of 32 bytes; AVX2 enabled.
        unsafe {
            for k in 0..8 {
                _mm256_storeu_si256(u.as_mut_ptr().add(32 * k) as *mut __m256i, Self::values(wb, k));
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl GroupedValues for Q6K {
    /// Two 64-value registers per half (as the four-row decode kernel unpacks them).
    #[inline(always)]
    unsafe fn unpack_values(wb: *const u8, u: &mut [u8; QK_K]) {
        // SAFETY: wb is a whole super-block, u holds 256 bytes; AVX-512F/BW enabled.
        unsafe {
            for n in 0..2 {
                let (a, b) = super::vnni4::q6_half(wb, n);
                let out = u.as_mut_ptr().add(128 * n) as *mut __m512i;
                _mm512_storeu_si512(out, a);
                _mm512_storeu_si512(out.add(1), b);
            }
        }
    }
}

/// Q4_K/Q5_K: d, dmin, the 8 six-bit scales (as i32) and the 8 mins
/// (packed i16 pairs) from bytes 0..16 (a 16-byte load at 4), in vector
/// registers (the scalar unpacking, [`Format::int_scales`], cost a fifth of
/// the AMX run kernel and a tenth of the one-group VNNI kernel).
///
/// # Safety
/// `wb` must be a whole Q4_K/Q5_K super-block; the caller must have AVX2
/// and F16C enabled (this is inlined into it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn k4_scales_d<F: Format>(wb: &[u8], row: &mut Unpacked) {
    // SAFETY: bytes 0..20 of a whole super-block are readable (the caller).
    unsafe {
        row.d = F::d(wb.as_ptr());
        // Lanes: the words w0, w1, w2 of the 12 scale bytes (and 4 bytes of values).
        let v = _mm_loadu_si128(wb.as_ptr().add(4) as *const __m128i);
        // Scales 0..4 (lane 0) and mins 0..4 (lane 1): the low six bits of w0, w1.
        let first = _mm_and_si128(v, _mm_set1_epi32(0x3f3f_3f3f));
        // Scales and mins 4..8: four bits from w2 (low nibbles, then high),
        // two from the top of w0 (scales) or w1 (mins).
        let top = _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(v, 6), _mm_set1_epi32(0x0303_0303)), 4);
        let w2 = _mm_shuffle_epi32::<0b00_00_10_10>(v);
        let nibbles = _mm_and_si128(_mm_srlv_epi32(w2, _mm_set_epi32(0, 0, 4, 0)), _mm_set1_epi32(0x0f0f_0f0f));
        let second = _mm_or_si128(top, nibbles);
        // Bytes: scales 0..8, then mins 0..8.
        let both = _mm_unpacklo_epi32(first, second);
        _mm256_storeu_si256(row.scales.as_mut_ptr() as *mut __m256i, _mm256_cvtepu8_epi32(both));
        _mm_storeu_si128(row.mins.as_mut_ptr() as *mut __m128i, _mm_cvtepu8_epi16(_mm_srli_si128::<8>(both)));
    }
}

/// How many super-blocks ahead the weight rows are prefetched.
#[cfg(target_arch = "x86_64")]
pub(super) const PREFETCH_AHEAD: usize = 2;

/// Prefetches super-block `b` (`bytes` long) of `row` into L1
/// (`_MM_HINT_T0`) or L2 (`_MM_HINT_T1`), if the row has it.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn prefetch_super_block<const HINT: i32>(row: &[u8], b: usize, bytes: usize) {
    if let Some(ahead) = row.get(b * bytes..(b + 1) * bytes) {
        for line in (0..bytes).step_by(64) {
            // SAFETY: a prefetch hint of an in-bounds address.
            unsafe { _mm_prefetch::<HINT>(ahead.as_ptr().add(line) as *const i8) };
        }
    }
}

/// Prefetches super-block `b` of the row `R` rows after `row` (`nb`
/// super-blocks long) into the L2. The engine's rows lie one after another,
/// so that is the same row of the next block of `R` rows; for other callers
/// the address is merely useless (a prefetch never faults). With one group
/// (batched decode, weights from memory) it made the kernel up to 17%
/// faster (`kquant_decode_16tok_256MiB/Q6K/grouped` 43.6-52.2 against
/// 52.6-54.0 ms, Q4_K 58.7-60.3 against 65.2-67.6, alternating runs); with
/// two groups (prefill in chunks of two, weights re-read from the L3) it
/// cost 3-6%. This kernel keeps its L1 prefetch as well: without it, Q6_K
/// took 48.1 and 51.6 ms against 45.9 and 50.6 (two runs).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_next_rows<F: Format, const R: usize>(row: &[u8], nb: usize, b: usize) {
    prefetch_l2(row.as_ptr().wrapping_add((R * nb + b) * F::BYTES), F::BYTES);
}

/// Prefetches into L2 the super-block this row's unpacking needs after
/// `b`: its `b + 1`, or after the last of its `nb` the first of the row `R`
/// rows on (rows `stride` super-blocks long, one after another in the
/// engine; elsewhere a useless hint). With many groups per unpacking
/// (prefill) the weights are read so slowly that the hardware prefetchers
/// leave each new line a miss to memory.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_next_super_block<F: Format, const R: usize>(row: &[u8], stride: usize, nb: usize, b: usize) {
    let next = if b + 1 < nb { b + 1 } else { R * stride };
    prefetch_l2(row.as_ptr().wrapping_add(next * F::BYTES), F::BYTES);
}

/// Prefetches into L2 the cache lines of `bytes` bytes from `p` (a hint:
/// `p` need not be a valid address).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn prefetch_l2(p: *const u8, bytes: usize) {
    let mut line = p.wrapping_sub(p as usize % 64);
    let end = p.wrapping_add(bytes);
    while line < end {
        // SAFETY: prefetching never faults; SSE is part of x86_64.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(line as *const i8) };
        line = line.wrapping_add(64);
    }
}

/// `R` rows of `F` times `out.len()` groups of 16 tokens, `nb` super-blocks
/// each (group `g`'s super-block `b` at `x[g * stride + b]`), added to `out`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn vnni_rows<F: GroupedValues, const R: usize>(w: [&[u8]; R], x: &[Q8KGroup], stride: usize, nb: usize, out: &mut [[[f32; GROUP]; R]]) {
    const { assert!(R <= MAX_ROWS) };
    let scratch = UNPACKED.with(|u| u.get()) as *mut [Unpacked; R];
    // SAFETY: the thread's own buffer, of at least R rows (asserted above),
    // each a valid `Unpacked` (plain integers and floats). Nothing else
    // borrows it while this runs: only this function uses it, and it
    // neither recurses nor calls anything that could run another job on
    // this thread (no pool or rayon calls).
    let rows = unsafe { &mut *scratch };
    for b in 0..nb {
        for (row, wr) in rows.iter_mut().zip(&w) {
            let wb = &wr[b * F::BYTES..(b + 1) * F::BYTES];
            // Few groups (batched decode, or prefill a chunk of groups at a
            // time) leave too little work per weight byte to hide its
            // load: fetch a later super-block ahead.
            if out.len() <= 2 {
                prefetch_super_block::<_MM_HINT_T0>(wr, b + PREFETCH_AHEAD, F::BYTES);
            } else {
                prefetch_next_super_block::<F, R>(wr, stride, nb, b);
            }
            if let [_] = out {
                prefetch_next_rows::<F, R>(wr, stride, b);
            }
            // SAFETY: wb is one whole super-block.
            unsafe { unpack_row::<F>(wb, row) };
        }
        // Two groups at a time share each broadcast weight word.
        let done = out.len() / 2 * 2;
        let mut pairs = out.chunks_exact_mut(2);
        for (p, pair) in pairs.by_ref().enumerate() {
            let (g0, g1) = (2 * p, 2 * p + 1);
            // SAFETY: g * stride + b < x.len() (checked by `check_strided`).
            let [t0, t1] = unsafe { run_sums::<F, R, 2>(rows, [&x[g0 * stride + b], &x[g1 * stride + b]]) };
            let (o0, o1) = pair.split_at_mut(1);
            // SAFETY: as above.
            unsafe {
                fold::<F, R>(rows, &x[g0 * stride + b], t0, &mut o0[0]);
                fold::<F, R>(rows, &x[g1 * stride + b], t1, &mut o1[0]);
            }
        }
        for (i, o) in pairs.into_remainder().iter_mut().enumerate() {
            let g = done + i;
            // SAFETY: as above.
            unsafe {
                let [t] = run_sums::<F, R, 1>(rows, [&x[g * stride + b]]);
                fold::<F, R>(rows, &x[g * stride + b], t, o);
            }
        }
    }
}

/// `Σ_runs scale · Σ u·q` per token of each of `G` groups, for every row
/// (exact i32; the order of integer additions does not matter).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn run_sums<F: Format, const R: usize, const G: usize>(rows: &[Unpacked; R], xg: [&Q8KGroup; G]) -> [[__m512i; R]; G] {
    let mut tot = [[_mm512_setzero_si512(); R]; G];
    for run in 0..QK_K / F::SUB {
        // Q6_K stores u = q + 32: each run's sum starts at -32 · Σx over its
        // 16 values (the group's bsum), so it ends as Σ (u - 32)·x.
        let mut start = [_mm512_setzero_si512(); G];
        if !F::MINS {
            for (s, x) in start.iter_mut().zip(&xg) {
                // SAFETY: run < 16 indexes bsums (64-byte aligned rows of 16 lanes).
                let bsum = unsafe { _mm512_load_si512(x.bsums[run].as_ptr() as *const __m512i) };
                *s = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(bsum, 5));
            }
        }
        let mut isum = [[_mm512_setzero_si512(); R]; G];
        for (sums, s) in isum.iter_mut().zip(start) {
            *sums = [s; R];
        }
        for k in run * F::SUB / 4..(run + 1) * F::SUB / 4 {
            // SAFETY: k < 64 indexes xg.qs (64-byte aligned rows of 16 lanes).
            let xv: [__m512i; G] = std::array::from_fn(|g| unsafe { _mm512_load_si512(xg[g].qs[k].as_ptr() as *const __m512i) });
            for (r, row) in rows.iter().enumerate() {
                // SAFETY: 4k + 4 <= 256 bytes of row.u.
                let wv = _mm512_set1_epi32(unsafe { std::ptr::read_unaligned(row.u.as_ptr().add(4 * k) as *const i32) });
                for g in 0..G {
                    isum[g][r] = _mm512_dpbusd_epi32(isum[g][r], wv, xv[g]);
                }
            }
        }
        for (r, row) in rows.iter().enumerate() {
            let scale = _mm512_set1_epi32(row.scales[run]);
            for g in 0..G {
                tot[g][r] = _mm512_add_epi32(tot[g][r], _mm512_mullo_epi32(isum[g][r], scale));
            }
        }
    }
    tot
}

/// One super-block of `R` unpacked rows times one group, given the rows'
/// integer sums `tot` ([`run_sums`]): adds the mins (or Q6_K's offset) and
/// folds into `out`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn fold<F: Format, const R: usize>(rows: &[Unpacked; R], xg: &Q8KGroup, tot: [__m512i; R], out: &mut [[f32; GROUP]; R]) {
    // SAFETY: xg.d is a 64-byte aligned array of 16 lanes.
    let xd = unsafe { _mm512_load_ps(xg.d.as_ptr()) };
    // The sub-block sums of the mins (Q4_K/Q5_K), two per i32 lane.
    let pairs: [__m512i; 4] = if F::MINS {
        // SAFETY: xg.pairs rows are 64-byte aligned arrays of 16 lanes.
        std::array::from_fn(|p| unsafe { _mm512_load_si512(xg.pairs[p].as_ptr() as *const __m512i) })
    } else {
        [_mm512_setzero_si512(); 4]
    };
    for ((o, t), row) in out.iter_mut().zip(tot).zip(rows) {
        // SAFETY: o holds 16 floats.
        let mut acc = unsafe { _mm512_loadu_ps(o.as_ptr()) };
        // Q6_K's -32 offset is already in `t` (see `run_sums`).
        acc = _mm512_fmadd_ps(_mm512_mul_ps(xd, _mm512_set1_ps(row.d.0)), _mm512_cvtepi32_ps(t), acc);
        if F::MINS {
            // Σ_j min_j · sum_j, exact in i32 (the one-token kernels' msum).
            let mut msum = _mm512_setzero_si512();
            for (pair, &m) in pairs.iter().zip(&row.mins) {
                msum = _mm512_dpwssd_epi32(msum, *pair, _mm512_set1_epi32(m));
            }
            // acc - dmin·msum in one rounding: the one-token kernels'
            // fma(-dmin, msum, acc) bit for bit (negation is exact).
            let dmin = _mm512_mul_ps(xd, _mm512_set1_ps(row.d.1));
            acc = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(msum), acc);
        }
        // SAFETY: o holds 16 floats.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), acc) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::kquant::test_rows::{lcg, random_row};
    use crate::quant::kquant::{kdot_kernels, quantize_row_q8k};

    /// A super-block count whose byte size wraps must be refused, not
    /// read: 2^60 super-blocks of 144 bytes wrap to 0 bytes (with no
    /// groups, the activations' check passes too).
    #[test]
    #[cfg_attr(not(host_avx512vnni), ignore = "needs AVX-512 VNNI (the grouped K-quant kernels)")]
    #[should_panic(expected = "weight row shorter")]
    fn grouped_kernels_refuse_a_super_block_count_that_overflows() {
        let kernels = kgemm_kernels(GgmlType::Q4K).expect("a VNNI CPU has the kernels");
        let row = [0u8; 144];
        (kernels.rows4_acc)([&row, &row, &row, &row], &[], 1 << 60, 1 << 60, &mut []);
    }

    #[test]
    fn grouped_kernels_exist_exactly_with_vnni() {
        let types = [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K];
        #[cfg(target_arch = "x86_64")]
        let vnni = super::super::vnni::available();
        #[cfg(not(target_arch = "x86_64"))]
        let vnni = false;
        // Without VNNI there are no grouped kernels and prefill takes the
        // four-token kernels (tested in the parent module) instead.
        assert_eq!(types.map(|t| kgemm_kernels(t).is_some()), [vnni; 3], "grouped kernels exist exactly with VNNI");
        assert!(kgemm_kernels(GgmlType::Q8_0).is_none(), "32-value blocks have their own grouped kernels");
    }

    /// Ranges of super-blocks added up in order (2 + 3 of 5, and 1 + 4,
    /// for 3 groups) give the whole-row kernel's results bit for bit.
    #[test]
    #[cfg_attr(not(host_avx512vnni), ignore = "needs a CPU with AVX-512 VNNI")]
    fn super_block_ranges_accumulate_to_the_whole_row_bit_for_bit() {
        let (nb, n) = (5, 40);
        let mut seed = 43u64;
        let x: Vec<f32> = (0..n * nb * QK_K).map(|_| (lcg(&mut seed) % 3001) as f32 / 600.0 - 2.5).collect();
        let mut xq = vec![Q8KBlock::default(); n * nb];
        quantize_row_q8k(&x, &mut xq);
        let groups = interleave_k(&xq, n, nb);
        for dtype in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
            let k = kgemm_kernels(dtype).expect("grouped kernels");
            let rows: Vec<Vec<u8>> = (0..4).map(|_| random_row(dtype, nb, None, &mut seed)).collect();
            let mut whole = vec![[[0f32; GROUP]; 4]; 3];
            (k.rows4)([&rows[0], &rows[1], &rows[2], &rows[3]], &groups, nb, &mut whole);
            for split in [2, 1] {
                let mut acc = vec![[[0f32; GROUP]; 4]; 3];
                for (first, count) in [(0, split), (split, nb - split)] {
                    let at = first * dtype.type_size();
                    (k.rows4_acc)([&rows[0][at..], &rows[1][at..], &rows[2][at..], &rows[3][at..]], &groups[first..], nb, count, &mut acc);
                }
                let bits = |v: &[[[f32; GROUP]; 4]]| v.iter().flatten().flatten().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&acc), bits(&whole), "{dtype:?}, split after {split}");
            }
        }
    }

    #[test]
    #[cfg_attr(not(host_avx512vnni), ignore = "needs a CPU with AVX-512 VNNI")]
    fn grouped_kernels_equal_the_one_token_kernels_bit_for_bit() {
        let types = [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K];
        assert!(types.iter().all(|&t| kgemm_kernels(t).is_some()), "built on a CPU with AVX-512 VNNI, run on one without");
        let mut seed = 41u64;
        // Three groups (a pair, then the single-group path), and one and two
        // groups over 5 super-blocks (the prefetching path, past the row's end).
        for (nb, n) in [(3, 37), (5, 16), (5, 32)] {
            let x: Vec<f32> = (0..n * nb * QK_K).map(|_| (lcg(&mut seed) % 3001) as f32 / 600.0 - 2.5).collect();
            let mut xq = vec![Q8KBlock::default(); n * nb];
            quantize_row_q8k(&x, &mut xq);
            let groups = interleave_k(&xq, n, nb);
            for dtype in types {
                let rows: Vec<Vec<u8>> = (0..4).map(|_| random_row(dtype, nb, None, &mut seed)).collect();
                let one = kdot_kernels(dtype).expect("kernels").one;
                let k = kgemm_kernels(dtype).expect("grouped kernels");
                let ng = n.div_ceil(GROUP);
                let mut four = vec![[[0f32; GROUP]; 4]; ng];
                (k.rows4)([&rows[0], &rows[1], &rows[2], &rows[3]], &groups, nb, &mut four);
                for (r, row) in rows.iter().enumerate() {
                    let mut single = vec![[[0f32; GROUP]; 1]; ng];
                    (k.one)(row, &groups, nb, &mut single);
                    for t in 0..n {
                        let (g, lane) = (t / GROUP, t % GROUP);
                        let want = one(row, &xq[t * nb..(t + 1) * nb]);
                        assert_eq!(four[g][r][lane].to_bits(), want.to_bits(), "{dtype:?} row {r} token {t}");
                        assert_eq!(single[g][0][lane].to_bits(), want.to_bits(), "{dtype:?} row {r} token {t} (one row)");
                    }
                }
            }
        }
    }
}
