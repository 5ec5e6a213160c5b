//! AVX-512 VNNI decode kernels for four Q4_K or Q6_K rows against one token
//! or a few (batched decode: each row's super-block is unpacked once for all
//! of them), with the per-row work cut down to unpacking, `vpdpbusd` and
//! `vpdpwssd`.
//!
//! Per row and super-block: the values are unpacked into four registers in
//! the order they lie in memory (the token's activations are permuted once to
//! match), multiplied with the activations (`vpdpbusd`; Q6_K's offset of 32 is
//! the accumulator's start, `-32·Σx`), packed to i16 (each lane is a sum of 4
//! products, |·| ≤ 16384, so nothing saturates) and multiplied by the run
//! scales with `vpdpwssd`. The scales and mins of the four rows are unpacked
//! together, the four rows' lanes are summed in one transposing reduction,
//! and the float fold runs in one 128-bit register, a lane per row.
//!
//! The integers are those of the other kernels (`isum`, `msum`) and the float
//! operations per row are the same (`fma(d_x·d, isum, acc)`, then
//! `fma(-(d_x·dmin), msum, acc)`): results equal the AVX2 and scalar kernels
//! bit for bit.

use super::gemm::prefetch_l2;
use super::{Q8KBlock, Q4K_BYTES, Q6K_BYTES};
use std::arch::x86_64::*;

/// Whether this CPU runs these kernels.
pub fn available() -> bool {
    super::vnni::available() && std::is_x86_feature_detected!("avx512vl")
}

/// A token's super-block as one format's kernel reads it.
struct Token {
    /// The activations, in the order of the unpacked weight registers.
    q: [__m512i; 4],
    /// Start of each `vpdpbusd` accumulator (Q6_K: `-32·Σ` of its 4
    /// activations, computed from `qs`; the scalar kernels use `bsums`, which
    /// [`super::quantize_row_q8k`] makes equal).
    start: [__m512i; 4],
    /// Q4_K: the 8 sums of 32 activations as i16, in every 128-bit lane.
    pairs: __m512i,
    /// The token's scale.
    d: f32,
}

/// `vpshufb` control for Q4_K's i16 scales. Register m (of 64 values), 128-bit
/// lane c: registers 0 and 1 hold runs 0 and 1 in lanes 0-1, runs 2 and 3
/// in lanes 2-3 (packed i16 lane j < 4 comes from register 0, j >= 4 from 1);
/// registers 2 and 3 likewise with runs 4-7 (`base` 4). High bytes zero.
const fn q4_scale_control(base: usize) -> [u8; 64] {
    let mut out = [0x80u8; 64];
    let mut i = 0;
    while i < 64 {
        let (c, j) = (i / 16, (i % 16) / 2);
        out[i] = (base + 2 * (c / 2) + if j >= 4 { 1 } else { 0 }) as u8;
        i += 2;
    }
    out
}

/// `vpshufb` control widening the mins (bytes 8..16 of each 128-bit lane) to i16.
const fn q4_min_control() -> [u8; 64] {
    let mut out = [0x80u8; 64];
    let mut i = 0;
    while i < 64 {
        out[i] = (8 + (i % 16) / 2) as u8;
        i += 2;
    }
    out
}

/// `vpermw` indices of Q6_K's 16 i16 scales: register m, lane c holds run
/// 4m + c; packed i16 lane j < 4 comes from register 2k, j >= 4 from 2k + 1
/// (`base` 8k).
const fn q6_scale_index(base: usize) -> [u16; 32] {
    let mut out = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        out[i] = (base + i / 8 + if i % 8 >= 4 { 4 } else { 0 }) as u16;
        i += 1;
    }
    out
}

static Q4_SCALES: [[u8; 64]; 2] = [q4_scale_control(0), q4_scale_control(4)];
static Q4_MINS: [u8; 64] = q4_min_control();
static Q6_SCALES: [[u16; 32]; 2] = [q6_scale_index(0), q6_scale_index(8)];
/// Row r's isum and msum (lanes 0 and 2 of 128-bit lane r) to lanes r and 4 + r.
static GATHER: [i32; 16] = [0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0];
/// (d, dmin) of the four rows' headers (i16 words 0 and 1 of each 128-bit lane).
static HALVES: [u16; 32] = [0, 8, 16, 24, 1, 9, 17, 25, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// The shuffle controls in registers, loaded once per call.
struct Controls {
    q4_scales: [__m512i; 2],
    q4_mins: __m512i,
    q6_scales: [__m512i; 2],
    gather: __m512i,
    halves: __m512i,
}

/// A 512-bit register from 64 bytes.
#[inline(always)]
unsafe fn load<T>(table: &[T]) -> __m512i {
    debug_assert!(std::mem::size_of_val(table) == 64);
    // SAFETY: callers pass 64-byte tables; AVX-512 enabled in every caller.
    unsafe { _mm512_loadu_si512(table.as_ptr() as *const __m512i) }
}

impl Controls {
    #[inline(always)]
    unsafe fn new() -> Self {
        // SAFETY: 64-byte tables; AVX-512 enabled in every caller.
        unsafe {
            Self {
                q4_scales: [load(&Q4_SCALES[0]), load(&Q4_SCALES[1])],
                q4_mins: load(&Q4_MINS),
                q6_scales: [load(&Q6_SCALES[0]), load(&Q6_SCALES[1])],
                gather: load(&GATHER),
                halves: load(&HALVES),
            }
        }
    }
}

/// One K-quant format as seen by these kernels.
trait Rows4Format {
    /// Bytes per super-block.
    const BYTES: usize;
    /// Whether the format has mins (Q4_K) or an offset of 32 (Q6_K).
    const MINS: bool;
    /// The token in this format's register order.
    unsafe fn token(xb: &Q8KBlock) -> Token;
    /// The four rows' unpacked scales (Q4_K: row r's 8 scales then 8 mins in
    /// 128-bit lane r) and their (d, dmin) as f32 (d in lanes 0..4, dmin in 4..8).
    unsafe fn header(wb: &[*const u8; 4], k: &Controls) -> (__m512i, __m256);
    /// One row's super-block unpacked: its values and i16 run scales.
    unsafe fn row(wb: *const u8, scales: __m512i, r: usize, k: &Controls) -> Row;
}

struct Q4K;
struct Q6K;

/// 128-bit lane `r` of `v` in all four lanes.
#[inline(always)]
unsafe fn lane_to_all(v: __m512i, r: usize) -> __m512i {
    // SAFETY: AVX-512 enabled in every caller.
    unsafe {
        match r {
            0 => _mm512_shuffle_i32x4::<0x00>(v, v),
            1 => _mm512_shuffle_i32x4::<0x55>(v, v),
            2 => _mm512_shuffle_i32x4::<0xAA>(v, v),
            _ => _mm512_shuffle_i32x4::<0xFF>(v, v),
        }
    }
}

/// Bytes 0..16 of the four rows' super-blocks, row r in 128-bit lane r.
#[inline(always)]
unsafe fn gather16(wb: &[*const u8; 4]) -> __m512i {
    // SAFETY: each wb[r] starts 16 readable bytes; AVX-512 enabled.
    unsafe {
        let v = _mm512_castsi128_si512(_mm_loadu_si128(wb[0] as *const __m128i));
        let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(wb[1] as *const __m128i));
        let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(wb[2] as *const __m128i));
        _mm512_inserti32x4::<3>(v, _mm_loadu_si128(wb[3] as *const __m128i))
    }
}

/// The token's four 64-byte registers of activations.
#[inline(always)]
unsafe fn activations(xb: &Q8KBlock) -> [__m512i; 4] {
    let p = xb.qs.as_ptr() as *const __m512i;
    // SAFETY: xb.qs holds 256 bytes; AVX-512 enabled in every caller.
    unsafe { [_mm512_loadu_si512(p), _mm512_loadu_si512(p.add(1)), _mm512_loadu_si512(p.add(2)), _mm512_loadu_si512(p.add(3))] }
}

/// One row's unpacked super-block: four registers of 64 unsigned values and
/// the i16 run scales of registers 0-1 and 2-3 once packed.
struct Row {
    u: [__m512i; 4],
    s01: __m512i,
    s23: __m512i,
}

/// Σ sc·(q·x) of one row against one token, as 16 lanes to be summed (lanes
/// of 4 products packed to i16, then multiplied by the i16 run scales).
#[inline(always)]
unsafe fn scaled_dots(row: &Row, t: &Token) -> __m512i {
    let (u, s01, s23) = (&row.u, row.s01, row.s23);
    // SAFETY: AVX-512 VNNI enabled in every caller.
    unsafe {
        let d0 = _mm512_dpbusd_epi32(t.start[0], u[0], t.q[0]);
        let d1 = _mm512_dpbusd_epi32(t.start[1], u[1], t.q[1]);
        let d2 = _mm512_dpbusd_epi32(t.start[2], u[2], t.q[2]);
        let d3 = _mm512_dpbusd_epi32(t.start[3], u[3], t.q[3]);
        let p01 = _mm512_packs_epi32(d0, d1);
        let p23 = _mm512_packs_epi32(d2, d3);
        _mm512_dpwssd_epi32(_mm512_madd_epi16(p01, s01), p23, s23)
    }
}

impl Rows4Format for Q4K {
    const BYTES: usize = Q4K_BYTES;
    const MINS: bool = true;

    #[inline(always)]
    unsafe fn token(xb: &Q8KBlock) -> Token {
        // SAFETY: xb.bsums holds 16 i16; AVX-512 enabled in every caller.
        unsafe {
            let x = activations(xb);
            // The weights' 64-byte halves hold sub-blocks (0, 2) in low
            // nibbles and (1, 3) in high ones (then 4..8 likewise).
            let q = [
                _mm512_shuffle_i64x2::<0b01_00_01_00>(x[0], x[1]),
                _mm512_shuffle_i64x2::<0b11_10_11_10>(x[0], x[1]),
                _mm512_shuffle_i64x2::<0b01_00_01_00>(x[2], x[3]),
                _mm512_shuffle_i64x2::<0b11_10_11_10>(x[2], x[3]),
            ];
            let sums = _mm256_loadu_si256(xb.bsums.as_ptr() as *const __m256i);
            let pairs = _mm256_cvtepi32_epi16(_mm256_madd_epi16(sums, _mm256_set1_epi16(1)));
            let zero = _mm512_setzero_si512();
            Token { q, start: [zero; 4], pairs: _mm512_broadcast_i32x4(pairs), d: xb.d }
        }
    }

    #[inline(always)]
    unsafe fn header(wb: &[*const u8; 4], k: &Controls) -> (__m512i, __m256) {
        // SAFETY: every wb[r] is a whole super-block; AVX-512 enabled.
        unsafe {
            // Per lane: words (d|dmin, q0..4, q4..8, q8..12) -> (sc0..4, sc4..8, m0..4, m4..8).
            let h = gather16(wb);
            let p = _mm512_shuffle_epi32::<0xED>(h); // words 1, 3, 2, 3
            let q = _mm512_shuffle_epi32::<0xA5>(h); // words 1, 1, 2, 2
            let shift = _mm512_set4_epi32(4, 0, 0, 0);
            let low_mask = _mm512_set4_epi32(0x0f0f_0f0f, 0x3f3f_3f3f, 0x0f0f_0f0f, 0x3f3f_3f3f);
            let high_mask = _mm512_set4_epi32(0x3030_3030, 0, 0x3030_3030, 0);
            let low = _mm512_and_si512(_mm512_srlv_epi32(p, shift), low_mask);
            let high = _mm512_and_si512(_mm512_srli_epi32::<2>(q), high_mask);
            let d = _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi16(k.halves, h)));
            (_mm512_or_si512(low, high), d)
        }
    }

    #[inline(always)]
    unsafe fn row(wb: *const u8, scales: __m512i, r: usize, k: &Controls) -> Row {
        // SAFETY: wb is a whole super-block; AVX-512 VNNI enabled.
        unsafe {
            let mask = _mm512_set1_epi8(0x0F);
            let w0 = _mm512_loadu_si512(wb.add(16) as *const __m512i);
            let w1 = _mm512_loadu_si512(wb.add(80) as *const __m512i);
            let u = [
                _mm512_and_si512(w0, mask),
                _mm512_and_si512(_mm512_srli_epi16::<4>(w0), mask),
                _mm512_and_si512(w1, mask),
                _mm512_and_si512(_mm512_srli_epi16::<4>(w1), mask),
            ];
            let sc = lane_to_all(scales, r);
            Row { u, s01: _mm512_shuffle_epi8(sc, k.q4_scales[0]), s23: _mm512_shuffle_epi8(sc, k.q4_scales[1]) }
        }
    }
}

/// Q6_K's 128 values `128n..128n + 128` as two registers of 64, unsigned.
///
/// # Safety
/// `wb` must be a whole Q6_K super-block and `n` 0 or 1; the caller must
/// have AVX-512F/BW enabled (this is inlined into it).
#[inline(always)]
pub(super) unsafe fn q6_half(wb: *const u8, n: usize) -> (__m512i, __m512i) {
    // SAFETY: wb is a whole Q6_K super-block; AVX-512 enabled in every caller.
    unsafe {
        let mask = _mm512_set1_epi8(0x0F);
        let bits = _mm512_set1_epi8(0x30);
        // Per 256-bit half of the broadcast qh: the high bits of the first 64
        // values sit at 0 (then 2), moved up to 4; of the next 64 at 4 (then
        // 6), moved down to 4.
        let up = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4);
        let down = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);
        let ql = _mm512_loadu_si512(wb.add(64 * n) as *const __m512i);
        let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(wb.add(128 + 32 * n) as *const __m256i));
        let ha = _mm512_and_si512(_mm512_sllv_epi64(qh, up), bits);
        let hb = _mm512_and_si512(_mm512_srlv_epi64(qh, down), bits);
        let a = _mm512_or_si512(_mm512_and_si512(ql, mask), ha);
        let b = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(ql), mask), hb);
        (a, b)
    }
}

impl Rows4Format for Q6K {
    const BYTES: usize = Q6K_BYTES;
    const MINS: bool = false;

    #[inline(always)]
    unsafe fn token(xb: &Q8KBlock) -> Token {
        // SAFETY: AVX-512 VNNI enabled in every caller.
        unsafe {
            let q = activations(xb);
            let zero = _mm512_setzero_si512();
            let thirty_two = _mm512_set1_epi8(32);
            let start = [
                _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, thirty_two, q[0])),
                _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, thirty_two, q[1])),
                _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, thirty_two, q[2])),
                _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, thirty_two, q[3])),
            ];
            Token { q, start, pairs: zero, d: xb.d }
        }
    }

    #[inline(always)]
    unsafe fn header(wb: &[*const u8; 4], _k: &Controls) -> (__m512i, __m256) {
        // SAFETY: every wb[r] is a whole super-block (d at 208..210); F16C enabled.
        unsafe {
            let d0 = (wb[0].add(208) as *const i16).read_unaligned();
            let d1 = (wb[1].add(208) as *const i16).read_unaligned();
            let d2 = (wb[2].add(208) as *const i16).read_unaligned();
            let d3 = (wb[3].add(208) as *const i16).read_unaligned();
            (_mm512_setzero_si512(), _mm256_cvtph_ps(_mm_setr_epi16(d0, d1, d2, d3, 0, 0, 0, 0)))
        }
    }

    #[inline(always)]
    unsafe fn row(wb: *const u8, _scales: __m512i, _r: usize, k: &Controls) -> Row {
        // SAFETY: wb is a whole super-block; AVX-512 VNNI enabled.
        unsafe {
            let (a, b) = q6_half(wb, 0);
            let (c, d) = q6_half(wb, 1);
            let sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(192) as *const __m128i)));
            let s01 = _mm512_permutexvar_epi16(k.q6_scales[0], sc);
            let s23 = _mm512_permutexvar_epi16(k.q6_scales[1], sc);
            Row { u: [a, b, c, d], s01, s23 }
        }
    }
}

/// `a`'s 128-bit lanes 0+2 and 1+3, then `b`'s.
#[inline(always)]
unsafe fn fold_halves(a: __m512i, b: __m512i) -> __m512i {
    // SAFETY: AVX-512 enabled in every caller.
    unsafe { _mm512_add_epi32(_mm512_shuffle_i64x2::<0b01_00_01_00>(a, b), _mm512_shuffle_i64x2::<0b11_10_11_10>(a, b)) }
}

/// The sums of four rows' 16 lanes, row r's in every i32 of 128-bit lane r,
/// next to the sums of `mins` (4 lanes per row): (isum, isum, msum, msum).
#[inline(always)]
unsafe fn reduce4(t: &[__m512i; 4], mins: __m512i) -> __m512i {
    // SAFETY: AVX-512 enabled in every caller.
    unsafe {
        let a01 = fold_halves(t[0], t[1]);
        let a23 = fold_halves(t[2], t[3]);
        let rows = _mm512_add_epi32(_mm512_shuffle_i64x2::<0b10_00_10_00>(a01, a23), _mm512_shuffle_i64x2::<0b11_01_11_01>(a01, a23));
        let c = _mm512_add_epi32(_mm512_unpacklo_epi64(rows, mins), _mm512_unpackhi_epi64(rows, mins));
        _mm512_add_epi32(c, _mm512_shuffle_epi32::<0xB1>(c))
    }
}

/// One token against the four unpacked rows of a super-block, folded into
/// `acc` (lane r: row r) as the scalar kernels fold: `fma(d_x·d, isum, acc)`,
/// then for Q4_K `fma(-(d_x·dmin), msum, acc)`. `mins16` holds the rows'
/// mins as i16 (lane r), `d` the rows' (d, dmin).
#[inline(always)]
unsafe fn fold_token<F: Rows4Format>(rows: &[Row; 4], mins16: __m512i, d: __m256, t: &Token, k: &Controls, acc: __m128) -> __m128 {
    // SAFETY: AVX-512 VNNI/VL, FMA enabled in every caller.
    unsafe {
        let sums = [scaled_dots(&rows[0], t), scaled_dots(&rows[1], t), scaled_dots(&rows[2], t), scaled_dots(&rows[3], t)];
        let mins = if F::MINS { _mm512_madd_epi16(mins16, t.pairs) } else { _mm512_setzero_si512() };
        let both = _mm256_cvtepi32_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi32(k.gather, reduce4(&sums, mins))));
        let f = _mm256_mul_ps(_mm256_set1_ps(t.d), d);
        let acc = _mm_fmadd_ps(_mm256_castps256_ps128(f), _mm256_castps256_ps128(both), acc);
        if F::MINS {
            _mm_fnmadd_ps(_mm256_extractf128_ps::<1>(f), _mm256_extractf128_ps::<1>(both), acc)
        } else {
            acc
        }
    }
}

/// How far ahead of the current four rows the same offsets are prefetched,
/// in rows. The rows of a matrix lie one after another; a prefetch is a hint
/// only, never dereferenced. Into L2 (`prefetcht1`), 16 rows ahead: on the
/// AMD EPYC VM (1 thread, 256 MiB of Q4_K rows) 16-17 GiB/s against 6.6-7.4
/// with `prefetcht0` four rows ahead and 4.4-6.7 without prefetching.
const PREFETCH_ROWS_AHEAD: usize = 16;

/// Four rows against `T` tokens over `n` super-blocks (each row's
/// super-block unpacked once for all of them), prefetching the same offsets
/// of rows further on. `out[t][r]` is row r · token t.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows4<F: Rows4Format, const T: usize>(w: [&[u8]; 4], x: [&[Q8KBlock]; T], n: usize) -> [[f32; 4]; T] {
    let mut acc = [_mm_setzero_ps(); T];
    let row_len = w[0].len();
    let ahead = w[0].as_ptr().wrapping_add(PREFETCH_ROWS_AHEAD * row_len);
    // SAFETY: AVX-512 enabled by this function's attribute.
    let k = unsafe { Controls::new() };
    for b in 0..n {
        for r in 0..4 {
            prefetch_l2(ahead.wrapping_add(r * row_len + b * F::BYTES), F::BYTES);
        }
        let at = b * F::BYTES..(b + 1) * F::BYTES;
        let wb = [w[0][at.clone()].as_ptr(), w[1][at.clone()].as_ptr(), w[2][at.clone()].as_ptr(), w[3][at].as_ptr()];
        // SAFETY: every wb[r] is one whole super-block (bounds-checked slices);
        // the features are enabled by this function's attribute.
        unsafe {
            let (scales, d) = F::header(&wb, &k);
            let rows = [F::row(wb[0], scales, 0, &k), F::row(wb[1], scales, 1, &k), F::row(wb[2], scales, 2, &k), F::row(wb[3], scales, 3, &k)];
            let mins16 = if F::MINS { _mm512_shuffle_epi8(scales, k.q4_mins) } else { _mm512_setzero_si512() };
            for (acc, x) in acc.iter_mut().zip(&x) {
                *acc = fold_token::<F>(&rows, mins16, d, &F::token(&x[b]), &k, *acc);
            }
        }
    }
    let mut out = [[0f32; 4]; T];
    for (o, a) in out.iter_mut().zip(acc) {
        // SAFETY: o holds 4 floats.
        unsafe { _mm_storeu_ps(o.as_mut_ptr(), a) };
    }
    out
}

/// The most tokens one call of [`rows4_tokens_q4_k`] / [`rows4_tokens_q6_k`] takes.
pub const MAX_TOKENS: usize = 8;

/// `out[t] = rows · token t` for `T` tokens of `nb` super-blocks each in `x`
/// (over the super-blocks every row holds; rows of one matrix are equally long).
///
/// # Panics
/// If `x` holds fewer than `T · nb` blocks (a caller's shape error), or the
/// CPU lacks these kernels.
#[inline(always)]
fn tokens<F: Rows4Format, const T: usize>(w: [&[u8]; 4], x: &[Q8KBlock], nb: usize, out: &mut [[f32; 4]]) {
    assert!(available(), "four-row VNNI kernels called on a CPU without AVX-512 VNNI/VL");
    assert!(x.len() >= T * nb, "four-row K-quant kernel: {} activation blocks for {T} tokens of {nb}", x.len());
    let n = w.iter().fold(nb, |n, r| n.min(r.len() / F::BYTES));
    let xs: [&[Q8KBlock]; T] = std::array::from_fn(|t| &x[t * nb..(t + 1) * nb]);
    // SAFETY: the CPU features were just checked.
    let res = unsafe { rows4::<F, T>(w, xs, n) };
    for (o, r) in out.iter_mut().zip(res) {
        *o = r;
    }
}

macro_rules! entries {
    ($rows4:ident, $many:ident, $fmt:ty, $name:literal) => {
        #[doc = concat!("Four ", $name, " rows · one token.")]
        pub fn $rows4(w: [&[u8]; 4], x: &[Q8KBlock]) -> [f32; 4] {
            let mut out = [[0f32; 4]; 1];
            tokens::<$fmt, 1>(w, x, x.len(), &mut out);
            out[0]
        }

        #[doc = concat!("Four ", $name, " rows · `out.len()` tokens of `nb` super-blocks each, one after another in `x`: `out[t][r]` (calls of at most [`MAX_TOKENS`] tokens).")]
        pub fn $many(w: [&[u8]; 4], x: &[Q8KBlock], nb: usize, out: &mut [[f32; 4]]) {
            match out.len() {
                0 => {}
                1 => tokens::<$fmt, 1>(w, x, nb, out),
                2 => tokens::<$fmt, 2>(w, x, nb, out),
                3 => tokens::<$fmt, 3>(w, x, nb, out),
                4 => tokens::<$fmt, 4>(w, x, nb, out),
                5 => tokens::<$fmt, 5>(w, x, nb, out),
                6 => tokens::<$fmt, 6>(w, x, nb, out),
                7 => tokens::<$fmt, 7>(w, x, nb, out),
                _ => {
                    let (head, tail) = out.split_at_mut(MAX_TOKENS);
                    tokens::<$fmt, MAX_TOKENS>(w, x, nb, head);
                    $many(w, x.get(MAX_TOKENS * nb..).unwrap_or(&[]), nb, tail);
                }
            }
        }
    };
}
entries!(rows4_q4_k, rows4_tokens_q4_k, Q4K, "Q4_K");
entries!(rows4_q6_k, rows4_tokens_q6_k, Q6K, "Q6_K");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::types::GgmlType;
    use crate::quant::kquant::scalar_kdot_kernels;

    /// A token of `nb` super-blocks with every activation `q` (scale 1/127).
    fn flat_token(nb: usize, q: i8) -> Vec<Q8KBlock> {
        let block = Q8KBlock { qs: [q; 256], bsums: [16 * i16::from(q); 16], d: 1.0 / 127.0 };
        vec![block; nb]
    }

    /// The largest products each format allows (where an i16 step could
    /// saturate) give the scalar kernels' results.
    #[test]
    #[cfg_attr(not(host_avx512vnni), ignore = "needs a CPU with AVX-512 VNNI")]
    fn extreme_values_do_not_saturate() {
        assert!(available(), "built on a CPU with AVX-512 VNNI, run on one without");
        let nb = 3;
        for (dtype, rows4) in [(GgmlType::Q4K, rows4_q4_k as fn([&[u8]; 4], &[Q8KBlock]) -> [f32; 4]), (GgmlType::Q6K, rows4_q6_k)] {
            let ts = dtype.type_size();
            let scalar = scalar_kdot_kernels(dtype).expect("scalar kernels").one;
            // Q4_K: nibbles 15, scales and mins 63; Q6_K: all values -32 (ql and
            // qh zero) with scales -128, or 31 with scales 127.
            let mut rows: Vec<Vec<u8>> = Vec::new();
            for fill in [0xFFu8, 0x00, 0x7F] {
                let mut w = vec![fill; nb * ts];
                for b in w.chunks_exact_mut(ts) {
                    if dtype == GgmlType::Q6K {
                        b[192..208].fill(if fill == 0 { 0x80 } else { 0x7F });
                        b[208..210].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
                    } else {
                        b[0..4].copy_from_slice(&[0x00, 0x14, 0x00, 0x10]);
                    }
                }
                rows.push(w);
            }
            rows.push(rows[0].clone());
            for q in [127i8, -127] {
                let x = flat_token(nb, q);
                let four = rows4([&rows[0], &rows[1], &rows[2], &rows[3]], &x);
                for (r, row) in rows.iter().enumerate() {
                    assert_eq!(four[r].to_bits(), scalar(row, &x).to_bits(), "{dtype:?} row {r}, activations {q}");
                }
            }
        }
    }

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    /// Rows · 1 to 11 tokens in one call (past `MAX_TOKENS`, which splits)
    /// equal the scalar kernel token by token, bit for bit.
    #[test]
    #[cfg_attr(not(host_avx512vnni), ignore = "needs a CPU with AVX-512 VNNI")]
    fn many_tokens_equal_the_scalar_kernels_bit_for_bit() {
        assert!(available(), "built on a CPU with AVX-512 VNNI, run on one without");
        let mut seed = 3u64;
        let nb = 4;
        type Many = fn([&[u8]; 4], &[Q8KBlock], usize, &mut [[f32; 4]]);
        for (dtype, many) in [(GgmlType::Q4K, rows4_tokens_q4_k as Many), (GgmlType::Q6K, rows4_tokens_q6_k)] {
            let ts = dtype.type_size();
            let scalar = scalar_kdot_kernels(dtype).expect("scalar kernels").one;
            let rows: Vec<Vec<u8>> = (0..4)
                .map(|_| {
                    let mut w: Vec<u8> = (0..nb * ts).map(|_| lcg(&mut seed) as u8).collect();
                    for b in w.chunks_exact_mut(ts) {
                        // Finite d (and dmin) different in every row and block.
                        let mut scale = || half::f16::from_f32(0.0005 + (lcg(&mut seed) % 64) as f32 / 8000.0).to_bits().to_le_bytes();
                        let at = if dtype == GgmlType::Q6K { 208 } else { 0 };
                        b[at..at + 2].copy_from_slice(&scale());
                        if dtype == GgmlType::Q4K {
                            b[2..4].copy_from_slice(&scale());
                        }
                    }
                    w
                })
                .collect();
            for tokens in 1..=11 {
                let x: Vec<f32> = (0..tokens * nb * 256).map(|_| (lcg(&mut seed) % 2001) as f32 / 400.0 - 2.5).collect();
                let mut xq = vec![Q8KBlock::default(); tokens * nb];
                crate::quant::kquant::quantize_row_q8k(&x, &mut xq);
                let mut out = vec![[0f32; 4]; tokens];
                many([&rows[0], &rows[1], &rows[2], &rows[3]], &xq, nb, &mut out);
                for (t, lanes) in out.iter().enumerate() {
                    for (r, row) in rows.iter().enumerate() {
                        let want = scalar(row, &xq[t * nb..(t + 1) * nb]);
                        assert_eq!(lanes[r].to_bits(), want.to_bits(), "{dtype:?}, {tokens} tokens: token {t}, row {r}");
                    }
                }
            }
        }
    }
}
