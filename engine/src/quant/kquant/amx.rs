//! Prefill and batched-decode GEMM for K-quant weights on Intel AMX
//! (AMX-INT8 tiles).
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
//! multiplies one B tile (one group) by the A tiles of 32 rows (lo and hi of
//! two halves) into 4 C tiles: each activation tile serves 32 rows, which
//! matters where the activations do not fit the L2 (measured against two
//! groups of 16 rows: 2.55 against 2.70 ms for 1536 × 1536 × 512 tokens,
//! 21.4 against 28.3 ms for Q6_K 1536 × 8960). While the tiles work on the
//! next group, the vector units fold the last one.
//!
//! The expansion is table lookups ([`ByteTables`]: the bytes of every
//! `scale · value` product, one `vpermb` per byte plane and run), cheap
//! enough that Q4_K/Q5_K pay from one group (batched decode of 11-16
//! sequences; [`min_groups`]), but one group of them takes the run kernel
//! (`amx_runs`, no expansion at all). With one group of Q6_K there is nothing
//! to overlap the fold with, so the tiles of super-block b run while b + 1 is
//! expanded instead. Each call also fetches the next block of 32 rows into
//! the L2 (32 strided rows defeat the hardware prefetchers).
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

/// Weight rows per call (two A tiles of [`TILE_ROWS`]).
pub const ROWS: usize = 32;
/// Rows of one A tile (and of each half of [`AmxOut`]).
pub const TILE_ROWS: usize = 16;
/// One group's results: `[half][row][token]`, rows `16·half + row`.
pub type AmxOut = [[[f32; GROUP]; TILE_ROWS]; 2];

/// Whether this CPU and OS run AMX-INT8 tiles (and the AVX-512 the fold
/// needs), and `SPINDLE_AMX` does not turn them off. Asks the kernel for the
/// tile state on first use.
pub fn available() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        let off = std::env::var("SPINDLE_AMX").is_ok_and(|v| v == "0");
        !off && cpu_has_amx_int8() && super::vnni::available() && byte_permutes() && request_tile_state()
    })
}

/// AVX-512 VBMI and VL: the 256- and 512-bit `vpermb` of [`expand`]
/// (every CPU with AMX has them).
fn byte_permutes() -> bool {
    std::is_x86_feature_detected!("avx512vbmi") && std::is_x86_feature_detected!("avx512vl")
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

/// XCR0: which state components the OS saves (and so enables).
///
/// # Safety
/// The CPU must have XSAVE.
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

/// `ldtilecfg`'s 64-byte operand (palette 1).
#[repr(C, align(64))]
pub(super) struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    /// Palette 1, every tile unused.
    pub(super) fn empty() -> Self {
        Self { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] }
    }

    /// Tile `t` has `rows` rows of `bytes` bytes (at most 16 and 64).
    pub(super) fn set(&mut self, t: usize, rows: usize, bytes: usize) {
        self.rows[t] = rows.min(16) as u8;
        self.colsb[t] = bytes.min(64) as u16;
    }

    /// Tiles 0..8 of 16 rows × 64 bytes.
    fn uniform() -> Self {
        let mut cfg = Self::empty();
        for t in 0..8 {
            cfg.set(t, 16, 64);
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

/// The four C tiles of one group: `[lo rows 0..16, hi rows 0..16, lo rows 16..32, hi rows 16..32]`.
#[repr(C, align(64))]
struct Products([[[i32; GROUP]; 16]; 4]);

/// [`ROWS`] rows of `F` times every group (as [`super::gemm::KGemmRows4Fn`],
/// 32 rows); the second argument, when given, is the block of rows the
/// caller passes next, fetched into the L2 meanwhile (the 32 rows' accesses,
/// 32 strided streams, defeat the hardware prefetchers).
pub type KGemmAmxFn = fn(&[&[u8]; ROWS], Option<&[&[u8]; ROWS]>, &[Q8KGroup], usize, &mut [AmxOut]);

/// Groups of 16 tokens from which the AMX kernel of `dtype` beats the VNNI
/// one. Q4_K/Q5_K win from one group (batched decode, on the run kernel,
/// `amx_runs`); Q6_K, whose expansion needs two 64-entry lookups per run
/// pair, wins from two (`cargo bench --bench kernels --
/// "kquant_decode_16tok|kquant_gemm"`).
pub fn min_groups(dtype: crate::gguf::types::GgmlType) -> usize {
    use crate::gguf::types::GgmlType;
    match dtype {
        GgmlType::Q4K | GgmlType::Q5K => 1,
        _ => 2,
    }
}

/// The AMX kernel for a K-quant type, where [`available`].
pub fn amx_kernel(dtype: crate::gguf::types::GgmlType) -> Option<KGemmAmxFn> {
    use super::avx2::{Q4K, Q5K, Q6K};
    use crate::gguf::types::GgmlType;
    if !available() {
        return None;
    }
    macro_rules! kernel {
        ($fmt:ty) => {
            |w: &[&[u8]; ROWS], next: Option<&[&[u8]; ROWS]>, x: &[Q8KGroup], nb: usize, out: &mut [AmxOut]| {
                super::gemm::check(w, x, nb, out.len(), <$fmt>::BYTES);
                // SAFETY: AMX-INT8 with OS permission and AVX-512 VNNI/BW/F
                // and AVX2/FMA/F16C were detected (`available`); shapes checked.
                unsafe { amx_rows::<$fmt>(w, next, x, nb, out) }
            }
        };
    }
    // Q4_K/Q5_K take the run kernel for one group (batched decode).
    macro_rules! runs_or_expanded {
        ($fmt:ty) => {
            |w: &[&[u8]; ROWS], next: Option<&[&[u8]; ROWS]>, x: &[Q8KGroup], nb: usize, out: &mut [AmxOut]| {
                super::gemm::check(w, x, nb, out.len(), <$fmt>::BYTES);
                // SAFETY: as in `kernel!`.
                unsafe {
                    match out {
                        [one] => super::amx_runs::runs_rows::<$fmt>(w, next, x, nb, one),
                        _ => amx_rows::<$fmt>(w, next, x, nb, out),
                    }
                }
            }
        };
    }
    match dtype {
        GgmlType::Q4K => Some(runs_or_expanded!(Q4K)),
        GgmlType::Q5K => Some(runs_or_expanded!(Q5K)),
        GgmlType::Q6K => Some(kernel!(Q6K)),
        _ => None,
    }
}

/// [`ROWS`] rows of `F` times `out.len()` groups of 16 tokens, `nb` super-blocks each.
///
/// # Safety
/// The CPU must have AMX-INT8 with the OS's permission ([`available`]) and
/// the target features below; `check` must have passed for these shapes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl,avx512vbmi")]
unsafe fn amx_rows<F: Format>(w: &[&[u8]; ROWS], next: Option<&[&[u8]; ROWS]>, x: &[Q8KGroup], nb: usize, out: &mut [AmxOut]) {
    for o in out.iter_mut() {
        *o = [[[0.0; GROUP]; TILE_ROWS]; 2];
    }
    let cfg = TileConfig::uniform();
    // SAFETY: AMX is available (this function's contract); cfg is a valid
    // palette-1 configuration. The tile registers stay live from here to
    // `tilerelease` across several `asm!` blocks: nothing else in this
    // process uses them, and the compiler never allocates them.
    unsafe { asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly)) };
    with_scratch(|scratch| {
        if let [one] = out {
            // SAFETY: forwarded (the tiles are configured).
            unsafe { one_group::<F>(w, next, x, nb, one, scratch) };
        } else {
            // SAFETY: forwarded (the tiles are configured).
            unsafe { groups_each::<F>(w, next, x, nb, out, scratch) };
        }
    });
    // SAFETY: returns the tile state to its initial (unused) state.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// Two or more groups (prefill): each super-block is expanded once; while
/// the tiles multiply group g + 1, the vector units fold group g.
///
/// # Safety
/// As [`amx_rows`], with the tiles configured ([`TileConfig::uniform`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl,avx512vbmi")]
unsafe fn groups_each<F: Format>(
    w: &[&[u8]; ROWS],
    next: Option<&[&[u8]; ROWS]>,
    x: &[Q8KGroup],
    nb: usize,
    out: &mut [AmxOut],
    scratch: &mut Scratch,
) {
    let rows = &mut scratch.rows[0];
    let expanded = &mut scratch.expanded[0];
    let products = &mut scratch.products;
    let groups = out.len();
    for b in 0..nb {
        // SAFETY: forwarded.
        unsafe { expand_rows::<F>(w, next, b, rows, expanded) };
        // Software pipeline: while the tiles multiply group g + 1 (one
        // K-step at a time), the vector units fold group g (8 rows a step).
        let (first, rest) = products.split_at_mut(1);
        let mut buffers = [&mut first[0], &mut rest[0]];
        if groups > 0 {
            // SAFETY (all tile calls): the tiles are configured above.
            unsafe { group_products(expanded, &x[b], buffers[0]) };
        }
        for g in 0..groups {
            let next = x.get((g + 1) * nb + b).filter(|_| g + 1 < groups);
            let [done, pending] = &mut buffers;
            if next.is_some() {
                // SAFETY: as above.
                unsafe { tiles_zero() };
            }
            for s in 0..STEPS {
                if let Some(xn) = next {
                    // SAFETY: as above.
                    unsafe { tiles_step(expanded, xn, s) };
                }
                // SAFETY: as in the grouped kernel; `check` bounds g·nb + b.
                unsafe { fold_quarter::<F>(rows, done, s, &x[g * nb + b], &mut out[g]) };
            }
            if next.is_some() {
                // SAFETY: as above.
                unsafe { tiles_store(pending) };
                std::mem::swap(done, pending);
            }
        }
    }
}

/// A thread's working buffers, allocated once: two sets of row metadata
/// and expanded values (the one-group pipeline's double buffers; the
/// grouped path uses the first) and two sets of products. Every field is
/// written before it is read, so they are reused as they are.
#[repr(C, align(64))]
struct Scratch {
    rows: [[[Unpacked; TILE_ROWS]; 2]; 2],
    expanded: [Expanded; 2],
    products: [Products; 2],
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Option<Box<Scratch>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` on this thread's [`Scratch`] (allocated zeroed on first use).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|cell| {
        let mut slot = cell.borrow_mut();
        // SAFETY: all-zero bytes are a valid Scratch (integers and floats only).
        let scratch = slot.get_or_insert_with(|| unsafe { Box::<Scratch>::new_zeroed().assume_init() });
        f(scratch)
    })
}

/// Expands super-block `b` of the rows `w` into `rows` and `e`, fetching
/// the next block of rows ahead (see [`amx_rows`]).
///
/// # Safety
/// As [`amx_rows`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl,avx512vbmi")]
unsafe fn expand_rows<F: Format>(
    w: &[&[u8]; ROWS],
    next: Option<&[&[u8]; ROWS]>,
    b: usize,
    rows: &mut [[Unpacked; TILE_ROWS]; 2],
    e: &mut Expanded,
) {
    for (r, wr) in w.iter().enumerate() {
        // The next block into the L2 only: fetching this block's later
        // super-blocks into the L1 as well, for batched decode, made it 4-8%
        // slower (`kquant_decode_32tok_256MiB/Q4K/amx` 66.2 and 62.3 against
        // 63.9 and 57.6 ms without them, two runs).
        if let Some(next) = next {
            super::gemm::prefetch_super_block::<_MM_HINT_T1>(next[r], b, F::BYTES);
        }
        let row = &mut rows[r / TILE_ROWS][r % TILE_ROWS];
        // SAFETY: `check` guarantees nb whole super-blocks in every row.
        unsafe { expand::<F>(&wr[b * F::BYTES..(b + 1) * F::BYTES], row, &mut e.lo[r], &mut e.hi[r]) };
    }
}

/// One group (batched decode of up to 16 sequences): the tiles multiply
/// super-block b while the vector units expand super-block b + 1, then
/// its products are folded (double buffers for the expanded values and
/// the row metadata).
///
/// # Safety
/// As [`amx_rows`], with the tiles configured ([`TileConfig::uniform`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl,avx512vbmi")]
unsafe fn one_group<F: Format>(
    w: &[&[u8]; ROWS],
    next: Option<&[&[u8]; ROWS]>,
    x: &[Q8KGroup],
    nb: usize,
    out: &mut AmxOut,
    scratch: &mut Scratch,
) {
    let Scratch { rows, expanded, products } = scratch;
    let products = &mut products[0];
    for b in 0..=nb {
        if b < nb {
            // SAFETY: forwarded.
            unsafe { expand_rows::<F>(w, next, b, &mut rows[b % 2], &mut expanded[b % 2]) };
        }
        if b > 0 {
            // SAFETY: the tiles hold super-block b − 1's products.
            unsafe { tiles_store(products) };
            let meta = &rows[(b - 1) % 2];
            for s in 0..STEPS {
                // SAFETY: as in the grouped kernel; `check` bounds b − 1 < nb.
                unsafe { fold_quarter::<F>(meta, products, s, &x[b - 1], out) };
            }
        }
        if b < nb {
            // SAFETY: the tiles are configured (caller).
            unsafe {
                tiles_zero();
                for s in 0..STEPS {
                    tiles_step(&expanded[b % 2], &x[b], s);
                }
            }
        }
    }
}

/// All K-steps of one group into `c` (the first group of a super-block,
/// with no fold to overlap).
///
/// # Safety
/// The tiles must be configured ([`TileConfig::uniform`]).
#[inline(always)]
unsafe fn group_products(e: &Expanded, xg: &Q8KGroup, c: &mut Products) {
    // SAFETY: forwarded.
    unsafe {
        tiles_zero();
        for s in 0..STEPS {
            tiles_step(e, xg, s);
        }
        tiles_store(c);
    }
}

/// Rows folded after each K-step of the next group (a quarter of the rows).
const FOLD_ROWS: usize = ROWS / STEPS;

/// Folds quarter `s` of a group's products `c` into `out`: rows 8s..8s + 8,
/// the lower or upper half of tile half s / 2.
///
/// # Safety
/// As [`fold_rows`]; `s < STEPS`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn fold_quarter<F: Format>(rows: &[[Unpacked; TILE_ROWS]; 2], c: &Products, s: usize, xg: &Q8KGroup, out: &mut AmxOut) {
    let (half, upper) = (s / 2, s % 2 == 1);
    let meta = if upper { rows[half].last_chunk::<FOLD_ROWS>() } else { rows[half].first_chunk::<FOLD_ROWS>() };
    let o = &mut out[half];
    let o = if upper { o.last_chunk_mut::<FOLD_ROWS>() } else { o.first_chunk_mut::<FOLD_ROWS>() };
    if let (Some(meta), Some(o)) = (meta, o) {
        let first = if upper { FOLD_ROWS } else { 0 };
        // SAFETY: forwarded (the caller's contract).
        unsafe { fold_rows::<F>(meta, c, half, first, xg, o) };
    }
}

/// Folds rows `16·half + first..` (`FOLD_ROWS` of them) of a group's
/// products `c` into `out`: `tot = C_lo + 256·C_hi` per row, then the
/// grouped kernel's fold.
///
/// # Safety
/// The CPU must have the target features below; `first + FOLD_ROWS <= 16`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn fold_rows<F: Format>(
    rows: &[Unpacked; FOLD_ROWS],
    c: &Products,
    half: usize,
    first: usize,
    xg: &Q8KGroup,
    out: &mut [[f32; GROUP]; FOLD_ROWS],
) {
    let (lo, hi) = (&c.0[2 * half], &c.0[2 * half + 1]);
    let tot: [__m512i; FOLD_ROWS] = std::array::from_fn(|i| {
        // SAFETY: 64-byte aligned rows of 16 i32.
        unsafe {
            let l = _mm512_load_si512(lo[first + i].as_ptr() as *const __m512i);
            let h = _mm512_load_si512(hi[first + i].as_ptr() as *const __m512i);
            _mm512_add_epi32(l, _mm512_slli_epi32(h, 8))
        }
    });
    // SAFETY: the target features are enabled here.
    unsafe { fold::<F, FOLD_ROWS>(rows, xg, tot, out) };
}

/// `w = u · sc` split into bytes (`[lo, hi][sc][u]`) for every 6-bit scale
/// `sc` and 5-bit value `u` of Q4_K/Q5_K: one `vpermb` per byte plane and
/// run of 32 values replaces widening, multiplying and narrowing.
#[repr(C, align(64))]
struct ByteTables<const S: usize, const U: usize>([[[u8; U]; S]; 2]);

/// Q4_K/Q5_K: `u < 32`, `sc < 64`.
static K4_TABLES: ByteTables<64, 32> = k4_tables();
/// Q6_K: `w = (u − 32) · sc` for every 6-bit `u` and i8 scale (indexed by its byte).
static K6_TABLES: ByteTables<256, 64> = k6_tables();

const fn k4_tables() -> ByteTables<64, 32> {
    let mut t = ByteTables([[[0; 32]; 64]; 2]);
    let mut sc = 0;
    while sc < 64 {
        let mut u = 0;
        while u < 32 {
            let w = (sc * u) as i32;
            t.0[0][sc][u] = w as u8;
            t.0[1][sc][u] = (w >> 8) as u8;
            u += 1;
        }
        sc += 1;
    }
    t
}

const fn k6_tables() -> ByteTables<256, 64> {
    let mut t = ByteTables([[[0; 64]; 256]; 2]);
    let mut byte = 0;
    while byte < 256 {
        let sc = byte as u8 as i8 as i32;
        let mut u = 0;
        while u < 64 {
            let w = (u as i32 - 32) * sc;
            t.0[0][byte][u] = w as u8;
            t.0[1][byte][u] = (w >> 8) as u8;
            u += 1;
        }
        byte += 1;
    }
    t
}

/// Expands one row's super-block: its d, dmin and mins into `row`, its
/// scaled values into `lo`/`hi` (by table lookup, [`ByteTables`]).
///
/// # Safety
/// `wb` must be one whole super-block of `F`; the CPU must have the target features below.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl,avx512vbmi")]
unsafe fn expand<F: Format>(wb: &[u8], row: &mut Unpacked, lo: &mut [u8; QK_K], hi: &mut [u8; QK_K]) {
    // SAFETY: wb is one whole super-block (caller).
    row.d = unsafe { F::d(wb.as_ptr()) };
    let (scales, mins) = F::int_scales(wb);
    row.mins = std::array::from_fn(|p| pack_i16(mins[2 * p] as i16, mins[2 * p + 1] as i16));
    for k in 0..QK_K / 32 {
        // SAFETY: wb is one whole super-block.
        let u = unsafe { F::values(wb.as_ptr(), k) };
        let (l, h) = if F::SUB == 32 {
            // `scales[k] < 64` (6 bits), `u < 32`: one 32-entry table each.
            let sc = scales[k] as usize & 63;
            // SAFETY: 32-byte aligned rows of the static tables.
            let (tl, th) = unsafe {
                (
                    _mm256_load_si256(K4_TABLES.0[0][sc].as_ptr() as *const __m256i),
                    _mm256_load_si256(K4_TABLES.0[1][sc].as_ptr() as *const __m256i),
                )
            };
            (_mm256_permutexvar_epi8(u, tl), _mm256_permutexvar_epi8(u, th))
        } else {
            // Two runs of 16 (scales 2k and 2k + 1), `u < 64`: the second
            // run's lanes merge in from its own table.
            let (a, b) = (scales[2 * k] as u8 as usize, scales[2 * k + 1] as u8 as usize);
            let u = _mm512_zextsi256_si512(u);
            let table = |plane: usize, s: usize| {
                // SAFETY: 64-byte aligned rows of the static tables.
                unsafe { _mm512_load_si512(K6_TABLES.0[plane][s].as_ptr() as *const __m512i) }
            };
            let pick = |plane: usize| {
                let first = _mm512_permutexvar_epi8(u, table(plane, a));
                _mm512_castsi512_si256(_mm512_mask_permutexvar_epi8(first, 0xFFFF_0000, u, table(plane, b)))
            };
            (pick(0), pick(1))
        };
        // SAFETY: 32 bytes at 32k of 256-byte arrays.
        unsafe {
            _mm256_storeu_si256(lo.as_mut_ptr().add(32 * k) as *mut __m256i, l);
            _mm256_storeu_si256(hi.as_mut_ptr().add(32 * k) as *mut __m256i, h);
        }
    }
}

/// K-steps of 64 values per super-block.
const STEPS: usize = QK_K / 64;
/// Zeroes the four C tiles.
///
/// # Safety
/// The tiles must be configured ([`TileConfig::uniform`]).
#[inline(always)]
unsafe fn tiles_zero() {
    // SAFETY: the caller configured the tiles.
    unsafe { asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem)) };
}

/// K-step `s` (values 64s..64s+64) of `e` times one group into the C
/// tiles: `Σ lo·q` and `Σ hi·q` for rows 0..16 (tmm0, tmm1) and 16..32
/// (tmm2, tmm3).
///
/// # Safety
/// The tiles must be configured ([`TileConfig::uniform`]); `s < STEPS`.
#[inline(always)]
unsafe fn tiles_step(e: &Expanded, xg: &Q8KGroup, s: usize) {
    // Pointers from the whole arrays: each load reads 16 rows.
    let (lo, hi) = (e.lo.as_ptr().cast::<u8>(), e.hi.as_ptr().cast::<u8>());
    let half = TILE_ROWS * QK_K;
    // SAFETY: the caller configured 8 tiles of 16 × 64 bytes; every load
    // reads 16 rows of 64 bytes inside `e` (stride 256, from row 0 or 16)
    // or inside `xg.qs` (stride 64); 64s < 256.
    unsafe {
        asm!(
            "tileloadd tmm6, [{x} + {xs}*1]",
            "tileloadd tmm4, [{lo0} + {ws}*1]",
            "tileloadd tmm5, [{hi0} + {ws}*1]",
            "tdpbusd tmm0, tmm4, tmm6",
            "tdpbssd tmm1, tmm5, tmm6",
            "tileloadd tmm4, [{lo1} + {ws}*1]",
            "tileloadd tmm5, [{hi1} + {ws}*1]",
            "tdpbusd tmm2, tmm4, tmm6",
            "tdpbssd tmm3, tmm5, tmm6",
            x = in(reg) xg.qs.as_ptr().add(16 * s),
            lo0 = in(reg) lo.add(64 * s),
            hi0 = in(reg) hi.add(64 * s),
            lo1 = in(reg) lo.add(half + 64 * s),
            hi1 = in(reg) hi.add(half + 64 * s),
            xs = in(reg) 64usize,
            ws = in(reg) QK_K,
            options(nostack, readonly),
        );
    }
}

/// Stores the four C tiles into `c`.
///
/// # Safety
/// The tiles must be configured ([`TileConfig::uniform`]).
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
    use crate::quant::kquant::test_rows::{lcg, random_row as row};
    use crate::quant::kquant::{kdot_kernels, quantize_row_q8k, Q8KBlock};

    #[test]
    #[cfg_attr(not(host_amx), ignore = "needs a CPU with AMX-INT8")]
    fn amx_kernel_equals_the_one_token_kernels_bit_for_bit() {
        assert!(available(), "built on a CPU with AMX-INT8, but the tiles are unavailable here (or SPINDLE_AMX=0)");
        let mut seed = 7u64;
        // One group (whole, partial, at full scale: the run kernel for
        // Q4_K/Q5_K), a partial third group, four and five groups (both
        // product buffers, twice), and activations at full scale (every
        // value ±max: the largest integer sums).
        for (nb, n, extreme) in [(2, 16, false), (3, 11, false), (2, 16, true), (3, 37, false), (2, 64, false), (1, 80, false), (1, 48, true)] {
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
                let mut out = vec![[[[f32::NAN; GROUP]; TILE_ROWS]; 2]; n.div_ceil(GROUP)];
                kernel(&w, None, &groups, nb, &mut out);
                let one = kdot_kernels(dtype).expect("kernels").one;
                for (r, wr) in rows.iter().enumerate() {
                    for t in 0..n {
                        let want = one(wr, &xq[t * nb..(t + 1) * nb]);
                        let got = out[t / GROUP][r / TILE_ROWS][r % TILE_ROWS][t % GROUP];
                        assert_eq!(got.to_bits(), want.to_bits(), "{dtype:?} nb {nb} row {r} token {t}: {got} vs {want}");
                    }
                }
            }
        }
    }

    #[test]
    fn only_k_quants_have_an_amx_kernel() {
        for dtype in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::F16] {
            assert!(amx_kernel(dtype).is_none(), "{dtype:?}");
        }
    }

    #[test]
    #[cfg_attr(not(host_amx), ignore = "needs a CPU with AMX-INT8")]
    fn every_k_quant_has_an_amx_kernel_on_a_cpu_with_tiles() {
        for dtype in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
            assert!(amx_kernel(dtype).is_some(), "{dtype:?}: the tiles are unavailable here (or SPINDLE_AMX=0)");
        }
    }
}
