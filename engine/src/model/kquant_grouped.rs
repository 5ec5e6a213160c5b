//! Output rows of a K-quant layer on the grouped kernels (16 tokens a
//! group): AMX tiles on whole blocks of 32 rows, all groups at once, where
//! they pay; the rest on the AVX-512 VNNI kernels, a few groups at a time.

use super::sink::GroupSink;
use crate::quant::gemm::GROUP;
use crate::quant::kquant::gemm::{groups_in_l2, super_blocks_in_l2, KGemmKernels, Q8KGroup};

/// Output rows `rows` for all `n` tokens (`kgroups`: their groups, `nb`
/// super-blocks each) on the grouped K-quant kernels. AMX first, on whole
/// blocks of 32 rows with all the groups (it expands each weight
/// super-block once for all the groups it is given: chunks of 2 took the
/// Qwen2.5 1.5B's prefill from 264 to 228 tok/s). The rows left go to the
/// VNNI kernels, which read all the groups' activations for every 4 rows:
/// as many groups at a time as stay in the L2 (that 1.5B's prefill without
/// AMX: 131–143 → 180 tok/s, its down projection having 6 MB of
/// activations at 512 tokens); where fewer than 8 groups would fit, blocks
/// of 4 rows take 8 groups over ranges of super-blocks instead
/// ([`vnni_rows_in_ranges`]).
pub(super) fn kquant_chunked<'w>(
    gemm: &KGemmKernels,
    row: &impl Fn(usize) -> &'w [u8],
    rows: std::ops::Range<usize>,
    kgroups: &[Q8KGroup],
    nb: usize,
    n: usize,
    write: &impl GroupSink,
) {
    let groups = n.div_ceil(GROUP);
    #[allow(unused_mut)]
    let mut r = rows.start;
    #[cfg(target_arch = "x86_64")]
    if let Some(amx) = gemm.amx.filter(|_| groups >= gemm.amx_min_groups) {
        r = amx_rows(amx, row, r..rows.end, kgroups, nb, n, write);
    }
    let per_chunk = groups_in_l2(nb);
    if per_chunk < RANGE_GROUPS && groups > per_chunk {
        r = vnni_rows_in_ranges(gemm, row, r..rows.end, kgroups, nb, n, write);
    }
    let mut four = vec![[[0f32; GROUP]; 4]; per_chunk];
    let mut one = vec![[[0f32; GROUP]; 1]; per_chunk];
    for (c, chunk) in kgroups.chunks(per_chunk * nb).enumerate() {
        let len = chunk.len() / nb;
        let out = VnniOut { four: &mut four[..len], one: &mut one[..len] };
        vnni_rows(gemm, row, r..rows.end, chunk, nb, c * per_chunk, n, write, out);
    }
}

/// Groups the VNNI kernels take at a time, a range of super-blocks at a
/// time, where the activations of fewer than these fit the L2 whole (long
/// rows: the down projection's).
const RANGE_GROUPS: usize = 8;

/// Whole blocks of 4 rows from `rows` on the VNNI kernels, [`RANGE_GROUPS`]
/// groups at a time and, for those, as many super-blocks at a time as keep
/// their activations in the L2 ([`super_blocks_in_l2`]), the results
/// accumulated across the ranges (bit-identical to whole rows). Every
/// weight row is read once per 8 groups and unpacked for 8, not 2, as
/// whole rows with the groups that fit would. Returns the first row left.
fn vnni_rows_in_ranges<'w>(
    gemm: &KGemmKernels,
    row: &impl Fn(usize) -> &'w [u8],
    rows: std::ops::Range<usize>,
    kgroups: &[Q8KGroup],
    nb: usize,
    n: usize,
    write: &impl GroupSink,
) -> usize {
    let groups = n.div_ceil(GROUP);
    let per_chunk = RANGE_GROUPS.min(groups);
    let per_range = super_blocks_in_l2(per_chunk).min(nb);
    let blocks = rows.len() / 4;
    if blocks == 0 || nb == 0 {
        return rows.start;
    }
    let bytes = row(rows.start).len() / nb;
    let mut sums = vec![[[0f32; GROUP]; 4]; blocks * per_chunk];
    for first in (0..groups).step_by(per_chunk) {
        let count = per_chunk.min(groups - first);
        sums.fill([[0.0; GROUP]; 4]);
        for from in (0..nb).step_by(per_range) {
            let len = per_range.min(nb - from);
            let x = &kgroups[first * nb + from..];
            for (i, block) in sums.chunks_exact_mut(per_chunk).enumerate() {
                let w: [&[u8]; 4] = std::array::from_fn(|j| &row(rows.start + 4 * i + j)[from * bytes..]);
                (gemm.rows4_acc)(w, x, nb, len, &mut block[..count]);
            }
        }
        for (i, block) in sums.chunks_exact(per_chunk).enumerate() {
            for (g, four) in block[..count].iter().enumerate() {
                write.put_group4(rows.start + 4 * i, first + g, four, n);
            }
        }
    }
    rows.start + 4 * blocks
}

/// The VNNI kernels' result buffers, one entry per group of a chunk.
struct VnniOut<'a> {
    four: &'a mut [[[f32; GROUP]; 4]],
    one: &'a mut [[[f32; GROUP]; 1]],
}

/// Output rows `rows` for the groups `kgroups` (`nb` super-blocks each,
/// the first being group `first` of the `n` tokens) on the VNNI kernels: 4
/// rows at a time, then single rows.
#[allow(clippy::too_many_arguments)]
fn vnni_rows<'w>(
    gemm: &KGemmKernels,
    row: &impl Fn(usize) -> &'w [u8],
    rows: std::ops::Range<usize>,
    kgroups: &[Q8KGroup],
    nb: usize,
    first: usize,
    n: usize,
    write: &impl GroupSink,
    out: VnniOut,
) {
    let mut r = rows.start;
    while r + 4 <= rows.end {
        (gemm.rows4)([row(r), row(r + 1), row(r + 2), row(r + 3)], kgroups, nb, out.four);
        for (g, four) in out.four.iter().enumerate() {
            write.put_group4(r, first + g, four, n);
        }
        r += 4;
    }
    for r in r..rows.end {
        (gemm.one)(row(r), kgroups, nb, out.one);
        for (g, one) in out.one.iter().enumerate() {
            let g = first + g;
            for (lane, v) in one[0].iter().enumerate().take(n.saturating_sub(g * GROUP)) {
                write.put(r, g * GROUP + lane, *v);
            }
        }
    }
}

/// Whole blocks of 32 rows from `rows` on AMX tiles, for all the groups
/// `kgroups`; returns the first row left.
#[cfg(target_arch = "x86_64")]
fn amx_rows<'w>(
    kernel: crate::quant::kquant::amx::KGemmAmxFn,
    row: &impl Fn(usize) -> &'w [u8],
    rows: std::ops::Range<usize>,
    kgroups: &[Q8KGroup],
    nb: usize,
    n: usize,
    write: &impl GroupSink,
) -> usize {
    use crate::quant::kquant::amx::{ROWS, TILE_ROWS};
    let mut out = vec![[[[0f32; GROUP]; TILE_ROWS]; 2]; n.div_ceil(GROUP)];
    let mut r = rows.start;
    while r + ROWS <= rows.end {
        let w: [&[u8]; ROWS] = std::array::from_fn(|i| row(r + i));
        let next: Option<[&[u8]; ROWS]> = (r + 2 * ROWS <= rows.end).then(|| std::array::from_fn(|i| row(r + ROWS + i)));
        kernel(&w, next.as_ref(), kgroups, nb, &mut out);
        for (g, group) in out.iter().enumerate() {
            for (h, half) in group.iter().enumerate() {
                // SAFETY: the AMX kernel exists only with AVX-512F.
                unsafe { write.put_group16(r + TILE_ROWS * h, g, half, n) };
            }
        }
        r += ROWS;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::sink::Sink;
    use crate::gguf::types::GgmlType;
    use crate::model::SendPtr;
    use crate::quant::dequant::QK_K;
    use crate::quant::kquant::gemm::{interleave_k, kgemm_kernels};
    use crate::quant::kquant::test_rows::{lcg, random_row};
    use crate::quant::kquant::{kdot_kernels, quantize_row_q8k, Q8KBlock};

    /// Activations too large for the L2 (5 groups of 16 tokens, the last
    /// partial, over 35 super-blocks): blocks of 4 rows go through the VNNI
    /// kernels in two ranges of super-blocks (19 + 16) with all 5 groups,
    /// single rows 2, 2 and 1 groups at a time; where the CPU has AMX, the
    /// first 32 rows take the tiles with all groups and the 9 left the VNNI
    /// kernels (none of 32 rows). 10 groups go through the ranges 8 and 2
    /// at a time. Every result is still the one-token kernel's, bit for
    /// bit, for rows taken 32, 4 and one at a time.
    #[test]
    #[cfg_attr(not(host_avx512vnni), ignore = "needs a CPU with AVX-512 VNNI")]
    fn grouped_k_quants_in_chunks_of_groups_equal_the_one_token_kernels() {
        let mut seed = 5u64;
        let nb = 35;
        assert_eq!(groups_in_l2(nb), 2, "the activations of 5 groups over {nb} super-blocks must not fit at once");
        assert!(super_blocks_in_l2(5) < nb && super_blocks_in_l2(RANGE_GROUPS) < nb, "rows in more than one range");
        let cols = nb * QK_K;
        // 32 rows: all on the tiles where there are tiles, none left for the
        // ranges; 150 tokens: groups 8 then 2 (the last partial) in the ranges.
        for (dtype, rows, n) in [(GgmlType::Q4K, 41, 75), (GgmlType::Q6K, 41, 75), (GgmlType::Q4K, 32, 75), (GgmlType::Q6K, 9, 150)] {
            let x: Vec<f32> = (0..n * cols).map(|_| (lcg(&mut seed) % 2001) as f32 / 500.0 - 2.0).collect();
            let mut xq = vec![Q8KBlock::default(); n * nb];
            quantize_row_q8k(&x, &mut xq);
            let kgroups = interleave_k(&xq, n, nb);
            let bytes: Vec<u8> = (0..rows).flat_map(|_| random_row(dtype, nb, None, &mut seed)).collect();
            let ts = dtype.type_size();
            let row = |r: usize| &bytes[r * nb * ts..(r + 1) * nb * ts];
            let gemm = kgemm_kernels(dtype).expect("grouped kernels with VNNI");
            let mut out = vec![f32::NAN; n * rows];
            let write = Sink { ptr: SendPtr(out.as_mut_ptr()), rows, tokens: n };
            kquant_chunked(&gemm, &row, 0..rows, &kgroups, nb, n, &write);
            let one = kdot_kernels(dtype).expect("kernels").one;
            for r in 0..rows {
                for t in 0..n {
                    let want = one(row(r), &xq[t * nb..(t + 1) * nb]);
                    assert_eq!(out[t * rows + r].to_bits(), want.to_bits(), "{dtype:?} row {r} token {t}");
                }
            }
        }
    }
}
