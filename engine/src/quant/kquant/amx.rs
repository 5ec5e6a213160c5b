//! Prefill GEMM for K-quant weights on Intel AMX (AMX-INT8 tiles).
//!
//! Same integers and the same float fold as the AVX-512 grouped kernel
//! ([`super::gemm`]), so every result is bit-identical to it (and to the
//! one-token kernels). Each weight super-block of [`ROWS`] rows is expanded
//! once into its scaled values `w = (u − offset) · scale` (i16: at most 1953
//! for Q5_K, |w| ≤ 4096 for Q6_K with its −32 offset), split into an
//! unsigned low byte and a signed high byte, `w = lo + 256 · hi`. Two tile
//! products per 64 values (`tdpbusd` for `lo`, `tdpbssd` for `hi`) give
//! `Σ w·q = C_lo + 256 · C_hi`, which is the grouped kernel's per-super-block
//! integer sum exactly (i32 arithmetic, no intermediate overflow: |C_lo| ≤
//! 255·128·256, |C_hi| ≤ 16·128·256). The mins and the float fold are the
//! grouped kernel's own code ([`super::gemm::fold`]).
//!
//! The activations are the grouped kernel's [`Q8KGroup`]s unchanged: 64
//! values of 16 tokens (`qs[16s..16s+16]`) are exactly one B tile (16 rows of
//! 4 values × 16 tokens). A tiles are 16 weight rows × 64 values. Each K-step
//! multiplies 2 A tiles (lo, hi) by 2 B tiles (two groups) into 4 C tiles,
//! so that no tile is reloaded while a product still reads it (tiles are not
//! renamed: reusing one serialises the products), and while the tiles work
//! on the next pair of groups the vector units fold the last one.
//!
//! Linux only: the process must ask the kernel for the tile state
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), done once by [`available`].
//! `SPINDLE_AMX=0` turns the kernel off (for side-by-side measurements).

use super::avx2::Format;
use super::gemm::{fold, pack_i16, Q8KGroup, Unpacked};
use super::QK_K;
use crate::quant::gemm::GROUP;
use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

/// Weight rows per call (one A tile).
pub const ROWS: usize = 16;

/// Whether this CPU and OS run AMX-INT8 tiles (and the AVX-512 the fold
/// needs), and `SPINDLE_AMX` does not turn them off. Asks the kernel for the
/// tile state on first use.
pub fn available() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        let off = std::env::var("SPINDLE_AMX").is_ok_and(|v| v == "0");
        !off && cpu_has_amx_int8() && super::vnni::available() && request_tile_state()
    })
}

/// CPUID leaf 7: AMX-TILE (EDX bit 24) and AMX-INT8 (EDX bit 25), and the
/// OS enabling the tile state in XCR0 (bits 17 and 18).
fn cpu_has_amx_int8() -> bool {
    if !std::is_x86_feature_detected!("xsave") || !std::is_x86_feature_detected!("avx512f") {
        return false;
    }
    let leaf7 = __cpuid_count(7, 0);
    let tiles = leaf7.edx & (1 << 24) != 0 && leaf7.edx & (1 << 25) != 0;
    // SAFETY: XSAVE (and so XGETBV) was detected above.
    let xcr0 = unsafe { xcr0() };
    tiles && xcr0 & (0b11 << 17) == 0b11 << 17
}

#[target_feature(enable = "xsave")]
unsafe fn xcr0() -> u64 {
    // SAFETY: the caller checked XSAVE.
    unsafe { _xgetbv(0) }
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: permission for
/// this process's threads to use the tile data (Linux 5.16 and later).
#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a syscall with two integer arguments; it only changes the process's permissions.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// `ldtilecfg`'s 64-byte operand: palette 1, every tile 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    fn uniform() -> Self {
        let mut cfg = Self { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
        for t in 0..8 {
            cfg.colsb[t] = 64;
            cfg.rows[t] = 16;
        }
        cfg
    }
}

/// One super-block of [`ROWS`] rows, scaled and split into bytes
/// (`lo[r][k]` unsigned, `hi[r][k]` signed; `w = lo + 256·hi`).
#[repr(C, align(64))]
struct Expanded {
    lo: [[u8; QK_K]; ROWS],
    hi: [[u8; QK_K]; ROWS],
}

/// The four C tiles of two groups: `[lo g0, hi g0, lo g1, hi g1]`.
#[repr(C, align(64))]
struct Products([[[i32; GROUP]; 16]; 4]);

/// [`ROWS`] rows of `F` times every group (as [`super::gemm::KGemmRows4Fn`], 16 rows).
pub type KGemmAmxFn = fn(&[&[u8]; ROWS], &[Q8KGroup], usize, &mut [[[f32; GROUP]; ROWS]]);

/// The AMX kernel for a K-quant type, where [`available`].
pub fn amx_kernel(dtype: crate::gguf::types::GgmlType) -> Option<KGemmAmxFn> {
    use super::avx2::{Q4K, Q5K, Q6K};
    use crate::gguf::types::GgmlType;
    if !available() {
        return None;
    }
    macro_rules! kernel {
        ($fmt:ty) => {
            |w: &[&[u8]; ROWS], x: &[Q8KGroup], nb: usize, out: &mut [[[f32; GROUP]; ROWS]]| {
                super::gemm::check(w, x, nb, out.len(), <$fmt>::BYTES);
                // SAFETY: AMX-INT8 with OS permission and AVX-512 VNNI/BW/F
                // and AVX2/FMA/F16C were detected (`available`); shapes checked.
                unsafe { amx_rows::<$fmt>(w, x, nb, out) }
            }
        };
    }
    match dtype {
        GgmlType::Q4K => Some(kernel!(Q4K)),
        GgmlType::Q5K => Some(kernel!(Q5K)),
        GgmlType::Q6K => Some(kernel!(Q6K)),
        _ => None,
    }
}

/// [`ROWS`] rows of `F` times `out.len()` groups of 16 tokens, `nb` super-blocks each.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn amx_rows<F: Format>(w: &[&[u8]; ROWS], x: &[Q8KGroup], nb: usize, out: &mut [[[f32; GROUP]; ROWS]]) {
    for o in out.iter_mut() {
        *o = [[0.0; GROUP]; ROWS];
    }
    let cfg = TileConfig::uniform();
    // SAFETY: AMX is available (the caller's contract); cfg is a valid palette-1 configuration.
    unsafe { asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly)) };
    let mut rows: Box<[Unpacked; ROWS]> =
        Box::new(std::array::from_fn(|_| Unpacked { u: [0; QK_K], scales: [0; 16], mins: [0; 4], d: (0.0, 0.0) }));
    let mut expanded = Box::new(Expanded { lo: [[0; QK_K]; ROWS], hi: [[0; QK_K]; ROWS] });
    let mut products = Box::new([Products([[[0; GROUP]; 16]; 4]), Products([[[0; GROUP]; 16]; 4])]);
    let groups = out.len();
    // Groups go through the tiles in pairs; a lone last group has no partner.
    let pair = |p: usize, b: usize| (&x[2 * p * nb + b], x.get((2 * p + 1) * nb + b).filter(|_| 2 * p + 1 < groups));
    let pairs = groups.div_ceil(2);
    for b in 0..nb {
        for (r, row) in rows.iter_mut().enumerate() {
            // Few groups (batched decode) leave too little work per weight
            // byte to hide its load: fetch a later super-block ahead.
            if groups <= 2 {
                super::gemm::prefetch_super_block(w[r], b + super::gemm::PREFETCH_AHEAD, F::BYTES);
            }
            // SAFETY: `check` guarantees nb whole super-blocks in every row.
            unsafe { expand::<F>(&w[r][b * F::BYTES..(b + 1) * F::BYTES], row, &mut expanded.lo[r], &mut expanded.hi[r]) };
        }
        // Software pipeline: while the tiles multiply pair p + 1 (one
        // K-step at a time), the vector units fold pair p (a quarter a step).
        if pairs > 0 {
            let (x0, x1) = pair(0, b);
            // SAFETY (all tile calls): tiles configured above; every pointer
            // is to a whole, aligned buffer.
            unsafe {
                tiles_zero();
                for s in 0..STEPS {
                    tiles_step(&expanded, x0, x1, s);
                }
                tiles_store(&mut products[0]);
            }
        }
        for p in 0..pairs {
            let next = (p + 1 < pairs).then(|| pair(p + 1, b));
            if next.is_some() {
                // SAFETY: as above.
                unsafe { tiles_zero() };
            }
            let (done, pending) = products.split_at_mut(1);
            let (done, pending) = if p % 2 == 0 { (&done[0], &mut pending[0]) } else { (&pending[0], &mut done[0]) };
            for s in 0..STEPS {
                if let Some((x0, x1)) = next {
                    // SAFETY: as above.
                    unsafe { tiles_step(&expanded, x0, x1, s) };
                }
                // Quarter s: group 2p + s / 2, rows 8 (s % 2)..+8.
                let (half, g) = (s / 2, 2 * p + s / 2);
                if g >= groups {
                    continue;
                }
                let rs = (s % 2) * FOLD_ROWS..(s % 2 + 1) * FOLD_ROWS;
                let tot: [__m512i; FOLD_ROWS] = std::array::from_fn(|i| {
                    let m = rs.start + i;
                    // SAFETY: 64-byte aligned rows of 16 i32.
                    unsafe {
                        let lo = _mm512_load_si512(done.0[2 * half][m].as_ptr() as *const __m512i);
                        let hi = _mm512_load_si512(done.0[2 * half + 1][m].as_ptr() as *const __m512i);
                        _mm512_add_epi32(lo, _mm512_slli_epi32(hi, 8))
                    }
                });
                let meta: &[Unpacked; FOLD_ROWS] = (&rows[rs.clone()]).try_into().expect("FOLD_ROWS rows");
                let o: &mut [[f32; GROUP]; FOLD_ROWS] = (&mut out[g][rs]).try_into().expect("FOLD_ROWS rows");
                // SAFETY: as in the grouped kernel.
                unsafe { fold::<F, FOLD_ROWS>(meta, &x[g * nb + b], tot, o) };
            }
            if next.is_some() {
                // SAFETY: as above.
                unsafe { tiles_store(pending) };
            }
        }
    }
    // SAFETY: returns the tile state to its initial (unused) state.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// Expands one row's super-block: its d, dmin and mins into `row`, its
/// scaled values into `lo`/`hi`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn expand<F: Format>(wb: &[u8], row: &mut Unpacked, lo: &mut [u8; QK_K], hi: &mut [u8; QK_K]) {
    // SAFETY: wb is one whole super-block (caller).
    row.d = unsafe { F::d(wb.as_ptr()) };
    let (scales, mins) = F::int_scales(wb);
    row.mins = std::array::from_fn(|p| pack_i16(mins[2 * p] as i16, mins[2 * p + 1] as i16));
    let offset = _mm512_set1_epi16(if F::MINS { 0 } else { 32 });
    for k in 0..QK_K / 32 {
        let scale = if F::SUB == 32 {
            _mm512_set1_epi16(scales[k] as i16)
        } else {
            let low = _mm512_castsi256_si512(_mm256_set1_epi16(scales[2 * k] as i16));
            _mm512_inserti64x4::<1>(low, _mm256_set1_epi16(scales[2 * k + 1] as i16))
        };
        // SAFETY: wb is one whole super-block.
        let u = _mm512_cvtepu8_epi16(unsafe { F::values(wb.as_ptr(), k) });
        let wv = _mm512_mullo_epi16(_mm512_sub_epi16(u, offset), scale);
        // SAFETY: 32 bytes at 32k of 256-byte arrays.
        unsafe {
            _mm256_storeu_si256(lo.as_mut_ptr().add(32 * k) as *mut __m256i, _mm512_cvtepi16_epi8(wv));
            let high = _mm512_cvtepi16_epi8(_mm512_srai_epi16::<8>(wv));
            _mm256_storeu_si256(hi.as_mut_ptr().add(32 * k) as *mut __m256i, high);
        }
    }
}

/// K-steps of 64 values per super-block.
const STEPS: usize = QK_K / 64;
/// Rows folded per K-step of the next pair (a quarter of a pair's results).
const FOLD_ROWS: usize = ROWS / 2;

/// Zeroes the four C tiles.
#[inline(always)]
unsafe fn tiles_zero() {
    // SAFETY: the caller configured the tiles.
    unsafe { asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem)) };
}

/// K-step `s` (values 64s..64s+64) of `e` times two groups into the C
/// tiles: `Σ lo·q` and `Σ hi·q` for `x0` (tmm0, tmm1) and `x1` (tmm2,
/// tmm3); without `x1` (a lone last group), tmm2 and tmm3 are left alone.
#[inline(always)]
unsafe fn tiles_step(e: &Expanded, x0: &Q8KGroup, x1: Option<&Q8KGroup>, s: usize) {
    let (lo, hi) = (e.lo[0][64 * s..].as_ptr(), e.hi[0][64 * s..].as_ptr());
    // SAFETY (both blocks): the caller configured 8 tiles of 16 × 64 bytes;
    // every load reads 16 rows of 64 bytes inside `e` (stride 256) or `x.qs` (stride 64).
    unsafe {
        asm!(
            "tileloadd tmm4, [{lo} + {ws}*1]",
            "tileloadd tmm6, [{x0} + {xs}*1]",
            "tdpbusd tmm0, tmm4, tmm6",
            "tileloadd tmm5, [{hi} + {ws}*1]",
            "tdpbssd tmm1, tmm5, tmm6",
            x0 = in(reg) x0.qs[16 * s].as_ptr(),
            lo = in(reg) lo,
            hi = in(reg) hi,
            xs = in(reg) 64usize,
            ws = in(reg) QK_K,
            options(nostack, readonly),
        );
    }
    if let Some(x1) = x1 {
        // SAFETY: as above (tmm4 and tmm5 still hold this step's weights).
        unsafe {
            asm!(
                "tileloadd tmm7, [{x1} + {xs}*1]",
                "tdpbusd tmm2, tmm4, tmm7",
                "tdpbssd tmm3, tmm5, tmm7",
                x1 = in(reg) x1.qs[16 * s].as_ptr(),
                xs = in(reg) 64usize,
                options(nostack, readonly),
            );
        }
    }
}

/// Stores the four C tiles into `c`.
#[inline(always)]
unsafe fn tiles_store(c: &mut Products) {
    // SAFETY: the caller configured the tiles; every store writes 16 rows of 64 bytes inside `c`.
    unsafe {
        asm!(
            "tilestored [{c0} + {s}*1], tmm0",
            "tilestored [{c1} + {s}*1], tmm1",
            "tilestored [{c2} + {s}*1], tmm2",
            "tilestored [{c3} + {s}*1], tmm3",
            c0 = in(reg) c.0[0].as_mut_ptr(),
            c1 = in(reg) c.0[1].as_mut_ptr(),
            c2 = in(reg) c.0[2].as_mut_ptr(),
            c3 = in(reg) c.0[3].as_mut_ptr(),
            s = in(reg) 64usize,
            options(nostack),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::types::GgmlType;
    use crate::quant::kquant::gemm::interleave_k;
    use crate::quant::kquant::{kdot_kernels, quantize_row_q8k, Q8KBlock};

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    /// A row of `nb` super-blocks: random bytes (every integer scale and
    /// value), or all `fill` (the extremes), with finite float scales.
    fn row(dtype: GgmlType, nb: usize, fill: Option<u8>, seed: &mut u64) -> Vec<u8> {
        let ts = dtype.type_size();
        let mut w: Vec<u8> = (0..nb * ts).map(|_| fill.unwrap_or_else(|| lcg(seed) as u8)).collect();
        for b in w.chunks_exact_mut(ts) {
            let d = half::f16::from_f32(0.002 + (lcg(seed) % 50) as f32 / 10000.0).to_bits().to_le_bytes();
            let at = if dtype == GgmlType::Q6K { 208 } else { 0 };
            b[at..at + 2].copy_from_slice(&d);
            if dtype != GgmlType::Q6K {
                b[2..4].copy_from_slice(&half::f16::from_f32(0.003).to_bits().to_le_bytes());
            }
        }
        w
    }

    #[test]
    #[cfg_attr(not(host_amx), ignore = "needs a CPU with AMX-INT8")]
    fn amx_kernel_equals_the_one_token_kernels_bit_for_bit() {
        assert!(available(), "built on a CPU with AMX-INT8, but the tiles are unavailable here (or SPINDLE_AMX=0)");
        let mut seed = 7u64;
        // One group, a partial third group, and activations at full scale
        // (every value ±max: the largest integer sums).
        for (nb, n, extreme) in [(2, 16, false), (3, 37, false), (1, 48, true)] {
            let x: Vec<f32> = (0..n * nb * QK_K)
                .map(|i| if extreme { if i % 3 == 0 { -4.0 } else { 4.0 } } else { (lcg(&mut seed) % 3001) as f32 / 600.0 - 2.5 })
                .collect();
            let mut xq = vec![Q8KBlock::default(); n * nb];
            quantize_row_q8k(&x, &mut xq);
            let groups = interleave_k(&xq, n, nb);
            for dtype in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
                // Rows of all-ones bytes (largest values and scales; Q6_K's
                // scale -1), of 0x80 (Q6_K's scale -128) and random ones.
                let rows: Vec<Vec<u8>> = (0..ROWS)
                    .map(|r| match r {
                        0 => row(dtype, nb, Some(0xFF), &mut seed),
                        1 => row(dtype, nb, Some(0x80), &mut seed),
                        _ => row(dtype, nb, None, &mut seed),
                    })
                    .collect();
                let w: [&[u8]; ROWS] = std::array::from_fn(|r| rows[r].as_slice());
                let kernel = amx_kernel(dtype).expect("an AMX kernel for every K-quant type");
                let mut out = vec![[[f32::NAN; GROUP]; ROWS]; n.div_ceil(GROUP)];
                kernel(&w, &groups, nb, &mut out);
                let one = kdot_kernels(dtype).expect("kernels").one;
                for (r, wr) in rows.iter().enumerate() {
                    for t in 0..n {
                        let want = one(wr, &xq[t * nb..(t + 1) * nb]);
                        let got = out[t / GROUP][r][t % GROUP];
                        assert_eq!(got.to_bits(), want.to_bits(), "{dtype:?} nb {nb} row {r} token {t}: {got} vs {want}");
                    }
                }
            }
        }
    }

    #[test]
    fn amx_kernels_exist_exactly_where_the_tiles_are_available() {
        for dtype in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
            assert_eq!(amx_kernel(dtype).is_some(), available(), "{dtype:?}");
        }
        assert!(amx_kernel(GgmlType::Q8_0).is_none());
    }
}
