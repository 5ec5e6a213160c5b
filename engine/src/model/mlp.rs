//! The gated MLP of a batch of 16 tokens or more on K-quant weights, fused
//! around its activation.
//!
//! Unfused, the gate and up projections write `[tokens, rows]` outputs:
//! each grouped kernel result (rows × 16 tokens) is transposed and stored
//! token by token, one cache line per token far apart in an 18 MB buffer
//! (the Qwen2.5 1.5B at 512 tokens); the activation then reads both and
//! writes a third, which is quantized token by token and interleaved again
//! for the down projection. Here each task takes one super-block of 256
//! intermediate rows and up to 16 groups of 16 tokens (more tasks split the
//! groups): it runs the gate and up rows into a buffer of its thread (at
//! most 1 MiB), lane-major as the kernels produce them, and activates and
//! quantizes each group's 256 × 16 values straight into the down
//! projection's [`Q8KGroup`] ([`quantize_lanes_k`]). Every operation on
//! every value is the unfused path's, so for finite values the results are
//! bit-identical (tested below).

use super::linear::{kgroups_of, matmul_kgroups, GroupedRows, Linear, MatmulPrecision};
use super::sink::GroupSink;
use super::SendPtr;
use crate::error::Result;
use crate::quant::dequant::QK_K;
use crate::quant::gemm::GROUP;
use crate::quant::kquant::gemm::Q8KGroup;
use crate::quant::kquant::lanes::{quantize_lanes_k, Lanes};
use std::cell::RefCell;

/// `out = f(gate, up)` element-wise (`silu_mul`, `gelu_tanh_mul`).
pub type GateFn = fn(&mut [f32], &[f32], &[f32]);

/// One task's projection output: rows `first..first + 256` of `groups`
/// groups, group-major, each group's 256 rows of 16 lanes one after another
/// (a [`Lanes`]). All 16 lanes of every group are written (lanes past the
/// batch hold the kernels' results for zero activations).
struct LocalSink {
    ptr: SendPtr,
    first: usize,
    groups: usize,
}

impl LocalSink {
    /// Row `r`'s 16 lanes of group `g`; ignored outside the task's rows and groups.
    #[inline(always)]
    fn put_lanes(&self, r: usize, g: usize, lanes: &[f32; GROUP]) {
        if let Some(at) = self.at(r, g) {
            // SAFETY: inside the task's `groups × 256 × 16` buffer (`at`), which
            // no one else writes.
            unsafe { std::ptr::write_unaligned(self.ptr.get().add(at) as *mut [f32; GROUP], *lanes) }
        }
    }

    /// Where row `r`'s 16 lanes of group `g` start, if the task has them.
    fn at(&self, r: usize, g: usize) -> Option<usize> {
        let local = r.checked_sub(self.first).filter(|&l| l < QK_K && g < self.groups)?;
        Some((g * QK_K + local) * GROUP)
    }
}

impl GroupSink for LocalSink {
    fn put(&self, r: usize, t: usize, v: f32) {
        if let Some(at) = self.at(r, t / GROUP) {
            // SAFETY: as in `put_lanes`.
            unsafe { *self.ptr.get().add(at + t % GROUP) = v }
        }
    }

    #[inline(always)]
    fn put_group4(&self, r: usize, g: usize, out: &[[f32; GROUP]; 4], _n: usize) {
        for (i, lanes) in out.iter().enumerate() {
            self.put_lanes(r + i, g, lanes);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn put_group16(&self, r: usize, g: usize, out: &[[f32; GROUP]; 16], _n: usize) {
        for (i, lanes) in out.iter().enumerate() {
            self.put_lanes(r + i, g, lanes);
        }
    }
}

/// The three projections of a gated MLP.
pub struct MlpLayers<'a> {
    /// Gate projection.
    pub gate: &'a Linear,
    /// Up projection.
    pub up: &'a Linear,
    /// Down projection.
    pub down: &'a Linear,
}

/// The down projection's groups, written by the tasks at disjoint indices.
#[derive(Clone, Copy)]
struct GroupsPtr(*mut Q8KGroup);
// SAFETY: each task writes only the (group, super-block) entries it owns.
unsafe impl Send for GroupsPtr {}
// SAFETY: as above.
unsafe impl Sync for GroupsPtr {}

impl GroupsPtr {
    /// Entry `i`.
    ///
    /// # Safety
    /// `i` must be inside the vector and owned by the caller's task.
    unsafe fn entry<'a>(self, i: usize) -> &'a mut Q8KGroup {
        // SAFETY: the caller's contract.
        unsafe { &mut *self.0.add(i) }
    }
}

thread_local! {
    /// A task's gate and up results, reused (at most 1 MiB: [`TASK_GROUPS`]).
    static PROJECTED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `out = down · act(gate · x, up · x)` for `n` tokens of `x`, fused (see
/// the module). Returns false, having done nothing, where it does not
/// apply: fewer than 16 tokens, projections without grouped K-quant kernels
/// in `precision` (or with a bias or refined input), shapes that do not
/// chain (gate and up of different shapes, down not taking their width, a
/// width that is not a multiple of 256), or `x`/`out` too short.
pub fn gated_mlp_fused(mlp: &MlpLayers<'_>, x: &[f32], n: usize, precision: MatmulPrecision, act: GateFn, out: &mut [f32]) -> Result<bool> {
    let (cols, width) = (mlp.gate.cols(), mlp.gate.rows());
    let (Some(gate), Some(up), Some(_)) = (mlp.gate.grouped_rows(precision), mlp.up.grouped_rows(precision), mlp.down.grouped_rows(precision))
    else {
        return Ok(false);
    };
    let fits = n >= GROUP
        && width > 0
        && mlp.up.rows() == width
        && mlp.up.cols() == cols
        && mlp.down.cols() == width
        && width % QK_K == 0
        && cols % QK_K == 0
        && x.len() >= n * cols
        && out.len() >= n * mlp.down.rows();
    if !fits {
        return Ok(false);
    }
    let (groups, nb_in, nb) = (n.div_ceil(GROUP), cols / QK_K, width / QK_K);
    let kgroups = kgroups_of(x, n, cols);
    if kgroups.len() < groups * nb_in {
        return Ok(false);
    }
    // Super-blocks are the tasks; groups are split too where there are
    // fewer than two super-blocks per thread or more than TASK_GROUPS groups.
    let parts = (2 * rayon::current_num_threads()).div_ceil(nb).max(groups.div_ceil(TASK_GROUPS)).clamp(1, groups);
    let per_part = groups.div_ceil(parts);
    let mut down_groups = vec![Q8KGroup::default(); groups * nb];
    let dst = GroupsPtr(down_groups.as_mut_ptr());
    let projections = Projections { gate: &gate, up: &up, kgroups: &kgroups, nb_in, n, act };
    crate::pool::run(nb * parts, |task| {
        let (b, first) = (task / parts, task % parts * per_part);
        let count = per_part.min(groups.saturating_sub(first));
        if count > 0 {
            // SAFETY: the entries (first.., b) are this task's alone, inside `down_groups`.
            let dst: Vec<&mut Q8KGroup> = (first..first + count).map(|g| unsafe { dst.entry(g * nb + b) }).collect();
            projections.super_block(b, first, dst);
        }
    });
    matmul_kgroups(mlp.down, down_groups, n, out, precision)?;
    Ok(true)
}

/// Groups of 16 tokens a task takes at most: its buffer is then at most
/// 1 MiB (gate and up, 32 KiB per group).
const TASK_GROUPS: usize = 16;

/// What every task of [`gated_mlp_fused`] reads.
struct Projections<'a> {
    gate: &'a GroupedRows<'a>,
    up: &'a GroupedRows<'a>,
    /// The MLP input's groups (`nb_in` super-blocks each), `n` tokens.
    kgroups: &'a [Q8KGroup],
    nb_in: usize,
    n: usize,
    act: GateFn,
}

impl Projections<'_> {
    /// Gate and up rows of super-block `b` for the groups `first..` (one
    /// per entry of `dst`), activated and quantized into `dst`.
    fn super_block(&self, b: usize, first: usize, dst: Vec<&mut Q8KGroup>) {
        let count = dst.len();
        let tokens = (self.n - first * GROUP).min(count * GROUP);
        let xg = &self.kgroups[first * self.nb_in..(first + count) * self.nb_in];
        // Taken out of the cell while in use (nothing here reenters it).
        let mut buf = PROJECTED.with(|cell| cell.take());
        let len = count * QK_K * GROUP;
        if buf.len() < 2 * len {
            buf.resize(2 * len, 0.0);
        }
        let (g_out, u_out) = buf[..2 * len].split_at_mut(len);
        for (layer, projected) in [(self.gate, &mut *g_out), (self.up, &mut *u_out)] {
            let sink = LocalSink { ptr: SendPtr(projected.as_mut_ptr()), first: b * QK_K, groups: count };
            let row = |r: usize| layer.row(r);
            super::kquant_grouped::kquant_chunked(layer.gemm, &row, b * QK_K..(b + 1) * QK_K, xg, self.nb_in, tokens, &sink);
        }
        let mut lanes: Lanes = [[0.0; GROUP]; QK_K];
        for (g, out) in dst.into_iter().enumerate() {
            let at = g * QK_K * GROUP..(g + 1) * QK_K * GROUP;
            (self.act)(lanes.as_flattened_mut(), &g_out[at.clone()], &u_out[at]);
            quantize_lanes_k(&lanes, out);
        }
        PROJECTED.with(|cell| cell.replace(buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::types::GgmlType;
    use crate::model::linear::MatmulJob;
    use crate::model::ops::{gelu_tanh_mul, silu_mul};
    use crate::quant::kquant::gemm::kgemm_kernels;
    use crate::quant::kquant::test_rows::{lcg, random_row};
    use crate::weights::TensorView;

    fn layer(dtype: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> Linear {
        let bytes: Vec<u8> = (0..rows).flat_map(|_| random_row(dtype, cols / QK_K, None, seed)).collect();
        let view = TensorView { name: format!("{dtype:?}"), dtype, shape: vec![rows, cols], data: &bytes, shared: None };
        Linear::from_tensor(&view, rows, cols).expect("layer")
    }

    /// The unfused path: both projections, the activation, the down projection.
    fn composed(mlp: &MlpLayers<'_>, x: &[f32], n: usize, act: GateFn) -> Vec<f32> {
        let width = mlp.gate.rows();
        let (mut g, mut u, mut a) = (vec![0f32; n * width], vec![0f32; n * width], vec![0f32; n * width]);
        let mut jobs = [MatmulJob { layer: mlp.gate, out: &mut g }, MatmulJob { layer: mlp.up, out: &mut u }];
        crate::model::linear::matmul_many(&mut jobs, x, n, MatmulPrecision::Fast).expect("gate/up");
        act(&mut a, &g, &u);
        let mut out = vec![0f32; n * mlp.down.rows()];
        mlp.down.forward(&a, n, &mut out, MatmulPrecision::Fast).expect("down");
        out
    }

    /// For whole and partial groups (16, 37, 300 tokens), both activations,
    /// gate/up rows on AMX tiles (blocks of 32, where the CPU has them) and
    /// the VNNI kernels (Q6_K's one group), on 1 and 3 threads (3: groups
    /// split between tasks), the fused MLP's output is the unfused path's,
    /// bit for bit.
    #[test]
    #[cfg_attr(not(host_avx512vnni), ignore = "needs a CPU with AVX-512 VNNI")]
    fn the_fused_mlp_equals_the_unfused_path_bit_for_bit() {
        assert!(kgemm_kernels(GgmlType::Q4K).is_some(), "built on a CPU with AVX-512 VNNI, run on one without");
        let mut seed = 5u64;
        let (cols, width, rows) = (512, 512, 64);
        for (up_type, threads) in [(GgmlType::Q4K, 1), (GgmlType::Q4K, 3), (GgmlType::Q6K, 3)] {
            let (gate, up) = (layer(up_type, width, cols, &mut seed), layer(up_type, width, cols, &mut seed));
            let down = layer(GgmlType::Q6K, rows, width, &mut seed);
            let mlp = MlpLayers { gate: &gate, up: &up, down: &down };
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
            // 300 tokens: 19 groups, more than a task takes (16).
            for (n, act) in [(16usize, silu_mul as GateFn), (37, silu_mul as GateFn), (37, gelu_tanh_mul as GateFn), (300, silu_mul as GateFn)] {
                let x: Vec<f32> = (0..n * cols).map(|_| (lcg(&mut seed) % 4001) as f32 / 1000.0 - 2.0).collect();
                let (want, got) = pool.install(|| {
                    let mut out = vec![f32::NAN; n * rows];
                    let done = gated_mlp_fused(&mlp, &x, n, MatmulPrecision::Fast, act, &mut out).expect("fused");
                    assert!(done, "the fused path applies to {up_type:?}/Q6_K layers at {n} tokens");
                    (composed(&mlp, &x, n, act), out)
                });
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{up_type:?}, {n} tokens, {threads} threads");
            }
        }
    }

    /// Fewer than 16 tokens, exact precision, an output too small, a bias,
    /// a refined down projection, gate and up of different widths: the
    /// fused path declines and writes nothing.
    #[test]
    #[cfg_attr(not(host_avx512vnni), ignore = "needs a CPU with AVX-512 VNNI (else it always declines)")]
    fn the_fused_mlp_declines_where_it_does_not_apply() {
        let mut seed = 9u64;
        let q4k = |rows: usize, cols: usize, seed: &mut u64| layer(GgmlType::Q4K, rows, cols, seed);
        let (gate, up, down) = (q4k(256, 256, &mut seed), q4k(256, 256, &mut seed), q4k(32, 256, &mut seed));
        let biased = q4k(256, 256, &mut seed).with_bias(vec![0.5; 256]).expect("bias");
        let mut refined = q4k(32, 256, &mut seed);
        refined.refine_input();
        let wider_up = q4k(288, 256, &mut seed);
        let plain = MlpLayers { gate: &gate, up: &up, down: &down };
        assert!(gated_mlp_fused(&plain, &vec![0.5; 17 * 256], 17, MatmulPrecision::Fast, silu_mul, &mut vec![0.0; 17 * 32]).expect("ok"), "applies");
        let cases = [
            ("8 tokens", MlpLayers { gate: &gate, up: &up, down: &down }, 8, MatmulPrecision::Fast, 8),
            ("exact", MlpLayers { gate: &gate, up: &up, down: &down }, 17, MatmulPrecision::Exact, 17),
            ("short output", MlpLayers { gate: &gate, up: &up, down: &down }, 17, MatmulPrecision::Fast, 16),
            ("bias", MlpLayers { gate: &biased, up: &up, down: &down }, 17, MatmulPrecision::Fast, 17),
            ("refined", MlpLayers { gate: &gate, up: &up, down: &refined }, 17, MatmulPrecision::Fast, 17),
            ("up wider than gate", MlpLayers { gate: &gate, up: &wider_up, down: &down }, 17, MatmulPrecision::Fast, 17),
        ];
        for (what, mlp, n, precision, out_rows) in cases {
            let x = vec![0.5f32; n * 256];
            let mut out = vec![-1f32; out_rows * 32];
            let done = gated_mlp_fused(&mlp, &x, n, precision, silu_mul, &mut out).expect("no error");
            assert!(!done, "{what}");
            assert!(out.iter().all(|&v| v == -1.0), "{what}: nothing written");
        }
    }

    /// Each of the sink's stores puts row r's lane t of group g at group
    /// g, row r - first, lane t; nothing outside the task's rows or groups.
    #[test]
    fn local_sink_stores_group_major_rows_of_its_super_block() {
        let (first, groups) = (256, 2);
        let mut buf = vec![-1f32; groups * QK_K * GROUP];
        let sink = LocalSink { ptr: SendPtr(buf.as_mut_ptr()), first, groups };
        let value = |r: usize, g: usize, lane: usize| (1000 * r + 100 * g + lane) as f32;
        let four: [[f32; GROUP]; 4] = std::array::from_fn(|i| std::array::from_fn(|lane| value(300 + i, 1, lane)));
        sink.put_group4(300, 1, &four, 20);
        sink.put(258, 5, value(258, 0, 5));
        sink.put(258, 2 * GROUP, 7.0);
        sink.put(255, 0, 7.0);
        sink.put_group4(510, 0, &std::array::from_fn(|i| [value(510 + i, 0, 0); GROUP]), 16);
        let at = |r: usize, g: usize, lane: usize| buf[(g * QK_K + r - first) * GROUP + lane];
        for i in 0..4 {
            for lane in 0..GROUP {
                assert_eq!(at(300 + i, 1, lane), value(300 + i, 1, lane), "row {} lane {lane}", 300 + i);
            }
        }
        assert_eq!(at(258, 0, 5), value(258, 0, 5));
        assert_eq!(at(511, 0, 3), value(511, 0, 0), "the last row");
        let written = 4 * GROUP + 1 + 2 * GROUP;
        assert_eq!(buf.iter().filter(|&&v| v != -1.0).count(), written, "nothing else (rows 255, 512, 513 and group 2 dropped)");
    }
}
