//! Batched decode (one group of 16 tokens) of Q4_K/Q5_K on AMX tiles, one
//! tile product per run of 32 values.
//!
//! With one group the expansion of [`super::amx`] (every value times its
//! scale, split into two byte planes) is paid for 16 tokens only, and it
//! cost more than the tiles. Here the weights go to the tiles as they are
//! unpacked (`u < 32`, unsigned bytes, as the VNNI kernel unpacks them):
//! each run of 32 values is its own K-step of 32 (`tdpbusd` into a zeroed C
//! tile), stored, and its scale applied on the vector units, `Σ_j sc_j ·
//! C_j`. That is the grouped kernel's integer sum exactly (i32, the order of
//! integer additions does not matter), so the fold ([`super::gemm::fold`])
//! and every result are the other kernels', bit for bit.
//!
//! Per super-block of 32 rows: 16 tile products and 16 tile stores, against
//! 16 products, 4 stores and 32 rows' table expansions; the scales are
//! unpacked in vector registers. Measured on a Xeon (`cargo bench --bench
//! kernels -- kquant_decode_16tok`, one thread, same run): Q4_K 68.0–68.6
//! against 76.0–77.8 ms, Q5_K 58.1–59.2 against 68.0–69.9; the Qwen2.5 1.5B's
//! 16-sequence decode step 146–149 against 161–163 ms. Interleaving the
//! stages a run at a time (tiles of run j with the unpacking and folding of
//! 4 rows) was slower: the tile instructions do not overlap the vector work
//! here either way.

use super::amx::{AmxOut, TileConfig, ROWS, TILE_ROWS};
use super::avx2::{Format, Q4K, Q5K};
use super::gemm::{fold, k4_scales_d, prefetch_super_block, Q8KGroup, Unpacked};
use super::QK_K;
use crate::quant::gemm::GROUP;
use std::arch::asm;
use std::arch::x86_64::*;

/// Runs of 32 values (one integer scale each) per super-block.
const RUNS: usize = QK_K / 32;
/// Rows folded at a time (registers for their sums).
const FOLD_ROWS: usize = 8;

/// How a format's super-blocks are unpacked for the run kernel.
pub(super) trait RunFormat: Format + Sized {
    /// Where run `j`'s 32 values lie in [`Unpacked::u`].
    const RUN_AT: [usize; RUNS] = [0, 32, 64, 96, 128, 160, 192, 224];
    /// Unpacks super-block `wb` into `row`: values (at [`Self::RUN_AT`]),
    /// the runs' integer scales, packed mins, d and dmin.
    ///
    /// # Safety
    /// `wb` must be one whole super-block; the caller must have AVX-512F/BW
    /// and AVX2/F16C enabled (this is inlined into it).
    unsafe fn unpack_runs(wb: &[u8], row: &mut Unpacked);
}

impl RunFormat for Q4K {
    /// Each 64 bytes of nibbles unpack (in one register) to runs 4m and
    /// 4m + 2 (low nibbles), then 4m + 1 and 4m + 3 (high nibbles).
    const RUN_AT: [usize; RUNS] = [0, 64, 32, 96, 128, 192, 160, 224];
    #[inline(always)]
    unsafe fn unpack_runs(wb: &[u8], row: &mut Unpacked) {
        // SAFETY: bytes 16..144 (the nibbles) of a whole super-block; u holds 256 bytes.
        unsafe {
            let low = _mm512_set1_epi8(0x0F);
            for m in 0..2 {
                let q = _mm512_loadu_si512(wb.as_ptr().add(16 + 64 * m) as *const __m512i);
                let u = row.u.as_mut_ptr().add(128 * m);
                _mm512_storeu_si512(u as *mut __m512i, _mm512_and_si512(q, low));
                _mm512_storeu_si512(u.add(64) as *mut __m512i, _mm512_and_si512(_mm512_srli_epi16(q, 4), low));
            }
            k4_scales_d::<Self>(wb, row);
        }
    }
}

impl RunFormat for Q5K {
    #[inline(always)]
    unsafe fn unpack_runs(wb: &[u8], row: &mut Unpacked) {
        // SAFETY: a whole super-block; u holds 8 aligned registers of 32 bytes.
        unsafe {
            for k in 0..RUNS {
                _mm256_store_si256(row.u.as_mut_ptr().add(32 * k) as *mut __m256i, Self::values(wb.as_ptr(), k));
            }
            k4_scales_d::<Self>(wb, row);
        }
    }
}

/// Each run's products: `[run][half][row][token]`, rows `16·half + row`.
#[repr(C, align(64))]
struct RunProducts([[[[i32; GROUP]; TILE_ROWS]; 2]; RUNS]);

/// Tiles 0..4: C (16 × 16 i32); 4 and 5: A (16 rows × 32 unsigned
/// values); 6: B (one run of the group, 8 rows of 4 values × 16 tokens).
fn runs_config() -> TileConfig {
    let mut cfg = TileConfig::empty();
    for t in 0..4 {
        cfg.set(t, TILE_ROWS, 64);
    }
    cfg.set(4, TILE_ROWS, 32);
    cfg.set(5, TILE_ROWS, 32);
    cfg.set(6, 8, 64);
    cfg
}

/// A thread's working buffers for [`one_group_runs`], allocated once
/// (every field is written before it is read).
#[repr(C, align(64))]
struct RunScratch {
    rows: [[[Unpacked; TILE_ROWS]; 2]; 2],
    products: RunProducts,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Option<Box<RunScratch>>> = const { std::cell::RefCell::new(None) };
}

/// [`ROWS`] rows of `F` times one group of 16 tokens (`nb` super-blocks),
/// the AMX kernels' entry for one group of Q4_K/Q5_K.
///
/// # Safety
/// AMX must be available ([`super::amx::available`]), with the target
/// features below; `check` must have passed for these shapes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
pub(super) unsafe fn runs_rows<F: RunFormat>(w: &[&[u8]; ROWS], next: Option<&[&[u8]; ROWS]>, x: &[Q8KGroup], nb: usize, out: &mut AmxOut) {
    *out = [[[0.0; GROUP]; TILE_ROWS]; 2];
    let cfg = runs_config();
    // SAFETY: AMX is available (this function's contract); a valid palette-1
    // configuration. The tile registers stay live from here to `tilerelease`
    // across several `asm!` blocks: nothing else in this process uses them,
    // and the compiler never allocates them.
    unsafe { asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly)) };
    SCRATCH.with(|cell| {
        let mut slot = cell.borrow_mut();
        // SAFETY: all-zero bytes are a valid RunScratch (integers and floats only).
        let scratch = slot.get_or_insert_with(|| unsafe { Box::<RunScratch>::new_zeroed().assume_init() });
        // SAFETY: forwarded (the tiles are configured).
        unsafe { one_group_runs::<F>(w, next, x, nb, out, &mut scratch.rows, &mut scratch.products) };
    });
    // SAFETY: returns the tile state to its initial (unused) state.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// One group: [`ROWS`] rows of `F` (32-value runs) times `x` (`nb`
/// super-blocks) into `out`. `rows` are two double-buffered sets of row
/// metadata and values, `products` the runs' tile products.
///
/// # Safety
/// As [`super::amx`]'s kernels, with the tiles configured by
/// [`runs_config`]; `check` must have passed.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
unsafe fn one_group_runs<F: RunFormat>(
    w: &[&[u8]; ROWS],
    next: Option<&[&[u8]; ROWS]>,
    x: &[Q8KGroup],
    nb: usize,
    out: &mut AmxOut,
    rows: &mut [[[Unpacked; TILE_ROWS]; 2]; 2],
    products: &mut RunProducts,
) {
    for b in 0..=nb {
        if b < nb {
            for (r, wr) in w.iter().enumerate() {
                // Only the next block of rows is fetched (into the L2): also
                // fetching this block's later super-blocks into the L1 made
                // the kernel 8-16% slower (`kquant_decode_16tok_256MiB/Q4K/amx`
                // 60.1-63.3 against 54.5-55.4 ms without them, same run).
                if let Some(next) = next {
                    prefetch_super_block::<_MM_HINT_T1>(next[r], b, F::BYTES);
                }
                // SAFETY: `check` guarantees nb whole super-blocks in every row.
                unsafe { F::unpack_runs(&wr[b * F::BYTES..(b + 1) * F::BYTES], &mut rows[b % 2][r / TILE_ROWS][r % TILE_ROWS]) };
            }
        }
        if b > 0 {
            let meta = &rows[(b - 1) % 2];
            for (half, o) in out.iter_mut().enumerate() {
                for (chunk, o) in o.chunks_exact_mut(FOLD_ROWS).enumerate() {
                    let first = chunk * FOLD_ROWS;
                    if let (Ok(o), Ok(m)) = (
                        <&mut [[f32; GROUP]; FOLD_ROWS]>::try_from(o),
                        <&[Unpacked; FOLD_ROWS]>::try_from(&meta[half][first..first + FOLD_ROWS]),
                    ) {
                        // SAFETY: the tiles stored super-block b − 1's products (in order
                        // before these loads); `check` bounds b − 1 < nb.
                        unsafe { fold_runs::<F>(m, products, half, first, &x[b - 1], o) };
                    }
                }
            }
        }
        if b < nb {
            // SAFETY: the tiles are configured (caller); rows[b % 2] was just unpacked.
            unsafe { run_products(&rows[b % 2], &x[b], F::RUN_AT, products) };
        }
    }
}

/// `Σ_j sc_j · C_j` for rows `16·half + first..` (`FOLD_ROWS` of them),
/// then the grouped kernel's fold into `out`.
///
/// # Safety
/// The CPU must have the target features below.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn fold_runs<F: Format>(
    meta: &[Unpacked; FOLD_ROWS],
    c: &RunProducts,
    half: usize,
    first: usize,
    xg: &Q8KGroup,
    out: &mut [[f32; GROUP]; FOLD_ROWS],
) {
    // Loops, not `array::from_fn`: a closure does not inherit this
    // function's target features, and out of line it cost 5% here.
    let mut tot = [_mm512_setzero_si512(); FOLD_ROWS];
    for (j, run) in c.0.iter().enumerate() {
        for (i, (t, row)) in tot.iter_mut().zip(meta).enumerate() {
            // SAFETY: 64-byte aligned rows of 16 i32.
            let p = unsafe { _mm512_load_si512(run[half][first + i].as_ptr() as *const __m512i) };
            *t = _mm512_add_epi32(*t, _mm512_mullo_epi32(p, _mm512_set1_epi32(row.scales[j])));
        }
    }
    // SAFETY: the target features are enabled here.
    unsafe { fold::<F, FOLD_ROWS>(meta, xg, tot, out) };
}

/// Every run of one super-block of 32 unpacked rows times one group: a
/// K-step of 32 into zeroed C tiles (two halves of 16 rows), stored into
/// `c`. Runs alternate between C tiles 0/1 and 2/3.
///
/// # Safety
/// The tiles must be configured by [`runs_config`].
#[inline(always)]
unsafe fn run_products(rows: &[[Unpacked; TILE_ROWS]; 2], xg: &Q8KGroup, at: [usize; RUNS], c: &mut RunProducts) {
    let stride = std::mem::size_of::<Unpacked>();
    // Pointers from the whole arrays of 16 rows: each load reads all of them.
    let values = std::mem::offset_of!(Unpacked, u);
    let (u0, u1) = (rows[0].as_ptr().cast::<u8>().wrapping_add(values), rows[1].as_ptr().cast::<u8>().wrapping_add(values));
    for (j, run) in c.0.iter_mut().enumerate() {
        let [c0, c1] = run;
        // SAFETY: the caller configured the tiles; A loads read 16 rows of 32
        // bytes at at[j] <= 224 of each row's values (stride: one Unpacked), the B load
        // 8 rows of 64 bytes of xg.qs from row 8j (8j + 8 <= 64), the stores
        // 16 rows of 64 bytes inside `c`.
        unsafe {
            let (x, a0, a1) = (xg.qs.as_ptr().add(8 * j).cast::<u8>(), u0.add(at[j]), u1.add(at[j]));
            if j % 2 == 0 {
                asm!(
                    "tileloadd tmm6, [{x} + {xs}*1]",
                    "tileloadd tmm4, [{a0} + {ws}*1]",
                    "tileloadd tmm5, [{a1} + {ws}*1]",
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tdpbusd tmm0, tmm4, tmm6",
                    "tdpbusd tmm1, tmm5, tmm6",
                    "tilestored [{c0} + {xs}*1], tmm0",
                    "tilestored [{c1} + {xs}*1], tmm1",
                    x = in(reg) x, a0 = in(reg) a0, a1 = in(reg) a1,
                    c0 = in(reg) c0.as_mut_ptr(), c1 = in(reg) c1.as_mut_ptr(),
                    xs = in(reg) 64usize, ws = in(reg) stride,
                    options(nostack),
                );
            } else {
                asm!(
                    "tileloadd tmm6, [{x} + {xs}*1]",
                    "tileloadd tmm4, [{a0} + {ws}*1]",
                    "tileloadd tmm5, [{a1} + {ws}*1]",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    "tdpbusd tmm2, tmm4, tmm6",
                    "tdpbusd tmm3, tmm5, tmm6",
                    "tilestored [{c0} + {xs}*1], tmm2",
                    "tilestored [{c1} + {xs}*1], tmm3",
                    x = in(reg) x, a0 = in(reg) a0, a1 = in(reg) a1,
                    c0 = in(reg) c0.as_mut_ptr(), c1 = in(reg) c1.as_mut_ptr(),
                    xs = in(reg) 64usize, ws = in(reg) stride,
                    options(nostack),
                );
            }
        }
    }
}
