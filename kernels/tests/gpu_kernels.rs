//! Each kernel against a CPU reference on the GPU: random inputs, several
//! shapes including odd sizes, outputs poisoned with NaN before the launch,
//! and ‖out − ref‖ / ‖ref‖ within bf16 tolerance. The GPU tests are
//! ignored by a plain `cargo test` (no GPU in CI); `tools/gpu-check.sh` runs
//! them with `--include-ignored`, and there a missing GPU fails them.
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use half::bf16;
use spindle_kernels::device::{driver_present, Gpu};

/// bf16 keeps 8 significant bits; outputs are rounded once.
const TOLERANCE: f64 = 1e-2;

/// The first GPU; the test fails when there is none.
fn gpu() -> Gpu {
    assert!(driver_present(), "no CUDA driver on this machine (libcuda.so not found)");
    Gpu::open(0).unwrap_or_else(|e| panic!("a CUDA driver but no usable GPU: {e}"))
}

/// Deterministic values in [-scale, scale), rounded to bf16.
fn random(n: usize, seed: u64, scale: f32) -> Vec<bf16> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            bf16::from_f32(((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale)
        })
        .collect()
}

fn f32s(v: &[bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}

fn rel_err(out: &[bf16], reference: &[f32]) -> f64 {
    assert_eq!(out.len(), reference.len());
    assert!(out.iter().all(|v| v.to_f32().is_finite()), "a poisoned (NaN) output was never written");
    let diff: f64 = out.iter().zip(reference).map(|(o, r)| (f64::from(o.to_f32()) - f64::from(*r)).powi(2)).sum();
    let norm: f64 = reference.iter().map(|r| f64::from(*r).powi(2)).sum();
    (diff / norm.max(1e-30)).sqrt()
}

fn poisoned(g: &Gpu, n: usize) -> cudarc::driver::CudaSlice<bf16> {
    g.stream.clone_htod(&vec![bf16::NAN; n]).unwrap()
}

#[test]
#[ignore = "needs a CUDA GPU; tools/gpu-check.sh runs it with --include-ignored"]
fn add_rmsnorm_matches_the_cpu_with_and_without_the_residual() {
    let g = gpu();
    for (rows, n) in [(1, 1), (3, 31), (4, 576), (2, 1000), (5, 4097)] {
        let (x, w, r) = (random(rows * n, 1, 2.0), random(n, 2, 1.0), random(rows * n, 3, 2.0));
        let (dx, dw) = (g.stream.clone_htod(&x).unwrap(), g.stream.clone_htod(&w).unwrap());
        for with_residual in [false, true] {
            let mut dr = g.stream.clone_htod(&r).unwrap();
            let mut out = poisoned(&g, rows * n);
            g.add_rmsnorm(&mut out, with_residual.then_some(&mut dr), &dx, &dw, rows, n, 1e-5).unwrap();
            let got = g.stream.clone_dtoh(&out).unwrap();
            let mut reference = Vec::with_capacity(rows * n);
            let mut summed = Vec::with_capacity(rows * n);
            for row in 0..rows {
                let v: Vec<f32> = (0..n)
                    .map(|i| {
                        let xi = x[row * n + i].to_f32();
                        if with_residual { bf16::from_f32(xi + r[row * n + i].to_f32()).to_f32() } else { xi }
                    })
                    .collect();
                let scale = 1.0 / (v.iter().map(|a| a * a).sum::<f32>() / n as f32 + 1e-5).sqrt();
                reference.extend(v.iter().zip(f32s(&w)).map(|(a, wi)| a * scale * wi));
                summed.extend(v);
            }
            let err = rel_err(&got, &reference);
            assert!(err < TOLERANCE, "rows {rows} n {n} residual {with_residual}: rel err {err}");
            if with_residual {
                assert_eq!(f32s(&g.stream.clone_dtoh(&dr).unwrap()), summed, "the residual holds x + residual");
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU; tools/gpu-check.sh runs it with --include-ignored"]
fn silu_mul_matches_the_cpu() {
    let g = gpu();
    for n in [1, 7, 1536, 100_003] {
        let (gate, up) = (random(n, 4, 6.0), random(n, 5, 3.0));
        let mut out = poisoned(&g, n);
        g.silu_mul(&mut out, &g.stream.clone_htod(&gate).unwrap(), &g.stream.clone_htod(&up).unwrap(), n).unwrap();
        let reference: Vec<f32> = gate.iter().zip(&up).map(|(a, b)| {
            let a = a.to_f32();
            a / (1.0 + (-a).exp()) * b.to_f32()
        }).collect();
        let err = rel_err(&g.stream.clone_dtoh(&out).unwrap(), &reference);
        assert!(err < TOLERANCE, "n {n}: rel err {err}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU; tools/gpu-check.sh runs it with --include-ignored"]
fn embedding_gathers_rows_and_zeroes_unknown_ids() {
    let g = gpu();
    let (vocab, dim) = (50u32, 77usize);
    let table = random(vocab as usize * dim, 6, 1.0);
    let ids: Vec<u32> = vec![0, 49, 7, 7, 50, 1_000_000];
    let mut out = poisoned(&g, ids.len() * dim);
    g.embedding(&mut out, &g.stream.clone_htod(&table).unwrap(), &g.stream.clone_htod(&ids).unwrap(), ids.len(), dim, vocab).unwrap();
    let got = g.stream.clone_dtoh(&out).unwrap();
    for (r, &id) in ids.iter().enumerate() {
        let want: Vec<bf16> = if id < vocab { table[id as usize * dim..(id as usize + 1) * dim].to_vec() } else { vec![bf16::ZERO; dim] };
        assert_eq!(got[r * dim..(r + 1) * dim], want[..], "row {r} (id {id})");
    }
}

#[test]
#[ignore = "needs a CUDA GPU; tools/gpu-check.sh runs it with --include-ignored"]
fn rope_matches_the_cpu() {
    let g = gpu();
    for (tokens, heads, head_dim) in [(1, 1, 2), (3, 9, 64), (5, 4, 128)] {
        let x = random(tokens * heads * head_dim, 7, 2.0);
        let positions: Vec<i32> = (0..tokens as i32).map(|t| t * 37 + 5).collect();
        let mut dx = g.stream.clone_htod(&x).unwrap();
        g.rope_neox(&mut dx, &g.stream.clone_htod(&positions).unwrap(), tokens, heads, head_dim, 10_000.0).unwrap();
        let got = g.stream.clone_dtoh(&dx).unwrap();
        let half = head_dim / 2;
        let mut reference = f32s(&x);
        for (t, &pos) in positions.iter().enumerate() {
            for h in 0..heads {
                let base = (t * heads + h) * head_dim;
                for i in 0..half {
                    let angle = f64::from(pos) * 10_000f64.powf(-2.0 * i as f64 / head_dim as f64);
                    let (s, c) = (angle.sin() as f32, angle.cos() as f32);
                    let (a, b) = (x[base + i].to_f32(), x[base + i + half].to_f32());
                    reference[base + i] = a * c - b * s;
                    reference[base + i + half] = b * c + a * s;
                }
            }
        }
        let err = rel_err(&got, &reference);
        assert!(err < TOLERANCE, "{tokens}x{heads}x{head_dim}: rel err {err}");
    }
}

#[test]
fn a_missing_driver_or_device_is_an_error_not_a_panic() {
    // Without a driver (CI) any ordinal fails that way; with one (the device
    // machine) an ordinal past the last device does.
    let (ordinal, expected) = if driver_present() { (4096, "") } else { (0, "no CUDA driver") };
    let err = Gpu::open(ordinal).expect_err("opening must fail");
    assert!(err.to_string().contains(expected), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU; tools/gpu-check.sh runs it with --include-ignored"]
fn kv_write_fills_the_slots_and_skips_negative_ones() {
    let g = gpu();
    let (slots_total, kv_dim) = (40usize, 96usize);
    let (k, v) = (random(5 * kv_dim, 8, 1.0), random(5 * kv_dim, 9, 1.0));
    let slots: Vec<i64> = vec![3, 39, -1, 0, 17];
    let before = random(slots_total * kv_dim, 10, 1.0);
    let (mut kc, mut vc) = (g.stream.clone_htod(&before).unwrap(), g.stream.clone_htod(&before).unwrap());
    g.kv_write(&mut kc, &mut vc, &g.stream.clone_htod(&k).unwrap(), &g.stream.clone_htod(&v).unwrap(),
               &g.stream.clone_htod(&slots).unwrap(), slots.len(), kv_dim).unwrap();
    let (kc, vc) = (g.stream.clone_dtoh(&kc).unwrap(), g.stream.clone_dtoh(&vc).unwrap());
    let (mut want_k, mut want_v) = (before.clone(), before);
    for (t, &slot) in slots.iter().enumerate() {
        if slot >= 0 {
            let s = slot as usize * kv_dim;
            want_k[s..s + kv_dim].copy_from_slice(&k[t * kv_dim..(t + 1) * kv_dim]);
            want_v[s..s + kv_dim].copy_from_slice(&v[t * kv_dim..(t + 1) * kv_dim]);
        }
    }
    assert_eq!(kc, want_k);
    assert_eq!(vc, want_v);
}

/// Softmax attention of one query head over `context` cached tokens (the
/// last `window` of them with a window), in f64.
#[allow(clippy::too_many_arguments)]
fn attend_reference(q: &[f32], kc: &[f32], vc: &[f32], table: &[i32], context: usize, window: Option<usize>, kvh: usize, kv_dim: usize, block_size: usize, scale: f32) -> Vec<f32> {
    let head_dim = q.len();
    let slot = |t: usize| table[t / block_size] as usize * block_size + t % block_size;
    let first = window.map_or(0, |w| context.saturating_sub(w));
    let scores: Vec<f64> = (first..context)
        .map(|t| {
            let k = &kc[slot(t) * kv_dim + kvh * head_dim..][..head_dim];
            q.iter().zip(k).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>() * f64::from(scale)
        })
        .collect();
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    (0..head_dim)
        .map(|d| (first..context).map(|t| weights[t - first] * f64::from(vc[slot(t) * kv_dim + kvh * head_dim + d])).sum::<f64>() / total)
        .map(|x| x as f32)
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU; tools/gpu-check.sh runs it with --include-ignored"]
fn paged_decode_matches_the_cpu_across_partitions_gqa_and_windows() {
    use spindle_kernels::device::{DecodeKernel, DecodeShape};
    let g = gpu();
    // (heads, kv_heads, head_dim, block_size, context lengths): one split, several, GQA and MHA, odd lengths;
    // groups of 7 (Qwen2.5-0.5B), 16 and a head_dim of 36 (the grouped kernel does not take the last two),
    // head_dim 256 (one warp per row) and 8 (one lane per row). These small batches take the grouped
    // kernel's finer splits (32 to 128 tokens; 128 for the 16 sequences of 513), with cache blocks of one
    // token, of 48 (not dividing a split) and of 64 (wider than a split of 32).
    let cases: [(usize, usize, usize, usize, &[usize]); 13] = [
        (4, 4, 64, 16, &[1, 17]),
        (8, 2, 128, 16, &[300, 1, 255, 256, 257]),
        (6, 3, 80, 32, &[1000, 33]),
        (32, 8, 128, 16, &[4096]),
        (14, 2, 64, 16, &[77, 513, 2]),
        (16, 1, 64, 16, &[40, 300]),
        (4, 2, 36, 16, &[50]),
        (8, 1, 256, 16, &[700, 3]),
        (2, 1, 8, 16, &[600]),
        (32, 8, 128, 16, &[513; 16]),
        (8, 2, 64, 1, &[70, 5]),
        (8, 2, 64, 48, &[300]),
        (4, 1, 128, 64, &[130, 7]),
    ];
    let mut grouped_cases = 0;
    for (heads, kv_heads, head_dim, block_size, contexts) in cases {
        let seqs = contexts.len();
        let max_context = *contexts.iter().max().unwrap();
        let max_blocks = max_context.div_ceil(block_size);
        let num_blocks = seqs * max_blocks + 3;
        let kv_dim = kv_heads * head_dim;
        // Each sequence's blocks are scattered over the pool (a fixed permutation).
        let mut tables = vec![0i32; seqs * max_blocks];
        for (i, b) in tables.iter_mut().enumerate() {
            *b = ((i * 7919 + 5) % num_blocks) as i32;
        }
        let kc = random(num_blocks * block_size * kv_dim, 11, 1.0);
        let vc = random(num_blocks * block_size * kv_dim, 12, 1.0);
        let q = random(seqs * heads * head_dim, 13, 1.0);
        let scale = 1.0 / (head_dim as f32).sqrt();
        let shape = DecodeShape { seqs, heads, kv_heads, head_dim, block_size, max_blocks, max_context };
        let lens: Vec<i32> = contexts.iter().map(|&c| c as i32).collect();
        // Windows of one token, inside one partition, across a partition's
        // edge (partitions wholly before the window are empty) and wider
        // than every context.
        let kernels = if shape.fits_grouped() {
            grouped_cases += 1;
            vec![DecodeKernel::Auto, DecodeKernel::PerHead, DecodeKernel::Grouped]
        } else {
            vec![DecodeKernel::Auto, DecodeKernel::PerHead]
        };
        for (window, kernel) in [None, Some(1), Some(100), Some(300), Some(5000)].into_iter().flat_map(|w| kernels.iter().map(move |&k| (w, k))) {
            let mut out = poisoned(&g, seqs * heads * head_dim);
            g.paged_decode(kernel, &mut out, &g.stream.clone_htod(&q).unwrap(), &g.stream.clone_htod(&kc).unwrap(), &g.stream.clone_htod(&vc).unwrap(),
                                &g.stream.clone_htod(&tables).unwrap(), &g.stream.clone_htod(&lens).unwrap(), shape, scale, window).unwrap();
            let got = g.stream.clone_dtoh(&out).unwrap();
            let (qf, kf, vf) = (f32s(&q), f32s(&kc), f32s(&vc));
            let mut reference = Vec::with_capacity(got.len());
            for (s, &context) in contexts.iter().enumerate() {
                for h in 0..heads {
                    let qh = &qf[(s * heads + h) * head_dim..][..head_dim];
                    let table = &tables[s * max_blocks..(s + 1) * max_blocks];
                    reference.extend(attend_reference(qh, &kf, &vf, table, context, window, h / (heads / kv_heads), kv_dim, block_size, scale));
                }
            }
            let err = rel_err(&got, &reference);
            assert!(err < TOLERANCE, "{shape:?} window {window:?} {kernel:?}: rel err {err}");
        }
    }
    assert_eq!(grouped_cases, 11, "the grouped kernel was not tried on every shape it takes");
}

#[test]
#[ignore = "needs a CUDA GPU; tools/gpu-check.sh runs it with --include-ignored"]
fn paged_decode_rejects_shapes_it_does_not_take() {
    use spindle_kernels::device::{DecodeKernel, DecodeShape};
    let g = gpu();
    let one = g.stream.clone_htod(&[bf16::ZERO; 8]).unwrap();
    let ints = g.stream.clone_htod(&[0i32; 2]).unwrap();
    let mut out = poisoned(&g, 8);
    let shape = DecodeShape { seqs: 1, heads: 3, kv_heads: 2, head_dim: 8, block_size: 16, max_blocks: 1, max_context: 1 };
    let err = g.paged_decode(DecodeKernel::Auto, &mut out, &one, &one, &one, &ints, &ints, shape, 1.0, None).unwrap_err();
    assert!(err.to_string().contains("multiple of kv_heads"), "{err}");
    let fine = DecodeShape { heads: 2, ..shape };
    let err = g.paged_decode(DecodeKernel::Auto, &mut out, &one, &one, &one, &ints, &ints, fine, 1.0, Some(0)).unwrap_err();
    assert!(err.to_string().contains("window of 0"), "{err}");
    let odd_width = DecodeShape { heads: 2, kv_heads: 2, head_dim: 4, ..shape };
    let err = g.paged_decode(DecodeKernel::Grouped, &mut out, &one, &one, &one, &ints, &ints, odd_width, 1.0, None).unwrap_err();
    assert!(err.to_string().contains("grouped decode kernel does not take"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU; tools/gpu-check.sh runs it with --include-ignored"]
fn every_gemm_kernel_matches_the_cpu_for_odd_shapes_and_both_outputs() {
    use spindle_kernels::device::GemmKernel;
    let g = gpu();
    // Spindle: m ≤ 8 with k % 8 == 0 takes the skinny kernel, the rest tensor cores.
    // The skinny kernel's blocks take 1, 2, 4 or 8 rows of w by n (on 132
    // multiprocessors: 100 and 576 one, 2000 two, 4099 four, 20000 eight),
    // and k / 8 chunks that do not fill its unrolled loads (2056, 520).
    let shapes = [(1, 1, 1), (3, 65, 17), (64, 64, 64), (7, 576, 1536), (130, 49, 200), (1, 4099, 4096), (8, 100, 64), (9, 33, 8), (200, 300, 96),
                  (2, 2000, 1024), (4, 5000, 2056), (1, 20000, 520), (5, 1024, 4096)];
    for (m, n, k) in shapes {
        let (x, w) = (random(m * k, 14, 1.0), random(n * k, 15, 1.0));
        let (dx, dw) = (g.stream.clone_htod(&x).unwrap(), g.stream.clone_htod(&w).unwrap());
        let (xf, wf) = (f32s(&x), f32s(&w));
        let reference: Vec<f32> = (0..m * n)
            .map(|i| (0..k).map(|j| f64::from(xf[(i / n) * k + j]) * f64::from(wf[(i % n) * k + j])).sum::<f64>() as f32)
            .collect();
        let mut kernels = vec![GemmKernel::Auto, GemmKernel::Spindle, GemmKernel::Simt, GemmKernel::TensorCore];
        if g.has_cublas() {
            kernels.push(GemmKernel::Cublas);
        } else if m == 1 {
            println!("cuBLAS skipped: {}", g.gemm_backend());
        }
        // Auto twice: with its default choice, and with the skinny kernel
        // taking up to 8 rows.
        let default_rows = g.gemv_rows();
        for (kernel, gemv_rows) in kernels.into_iter().map(|k| (k, default_rows)).chain([(GemmKernel::Auto, 8)]) {
            g.set_gemv_rows(gemv_rows);
            let mut y16 = poisoned(&g, m * n);
            g.gemm_with(kernel, &mut y16, &dx, &dw, m, n, k).unwrap();
            let err = rel_err(&g.stream.clone_dtoh(&y16).unwrap(), &reference);
            assert!(err < TOLERANCE, "{kernel:?} (skinny up to {gemv_rows} rows) {m}x{n}x{k} bf16 out: rel err {err}");
            let mut y32 = g.stream.clone_htod(&vec![f32::NAN; m * n]).unwrap();
            g.gemm_with(kernel, &mut y32, &dx, &dw, m, n, k).unwrap();
            let got: Vec<bf16> = g.stream.clone_dtoh(&y32).unwrap().into_iter().map(bf16::from_f32).collect();
            let err = rel_err(&got, &reference);
            assert!(err < TOLERANCE, "{kernel:?} (skinny up to {gemv_rows} rows) {m}x{n}x{k} f32 out: rel err {err}");
        }
        g.set_gemv_rows(default_rows);
    }
}

#[test]
#[ignore = "needs a CUDA GPU; tools/gpu-check.sh runs it with --include-ignored"]
fn fused_skinny_gemms_match_the_cpu_and_refuse_what_they_do_not_take() {
    let g = gpu();
    // (m, k, rows of each job): q/k/v-like (a wide and two narrow), gate/up-like, one job, k with a tail.
    let cases: [(usize, usize, &[usize]); 4] = [(1, 1024, &[1024, 256, 256]), (8, 512, &[3000, 3000]), (3, 64, &[7]), (5, 2056, &[100, 4099, 33])];
    for (m, k, rows) in cases {
        let x = random(m * k, 21, 1.0);
        let dx = g.stream.clone_htod(&x).unwrap();
        let ws: Vec<Vec<bf16>> = rows.iter().enumerate().map(|(j, &n)| random(n * k, 22 + j as u64, 1.0)).collect();
        let dws: Vec<_> = ws.iter().map(|w| g.stream.clone_htod(w).unwrap()).collect();
        let mut ys: Vec<_> = rows.iter().map(|&n| poisoned(&g, m * n)).collect();
        let mut jobs: Vec<spindle_kernels::device::GemvJob<'_>> = dws.iter().zip(ys.iter_mut()).zip(rows).map(|((w, y), &n)| (w, y, n)).collect();
        g.gemv_jobs(&dx, m, k, &mut jobs).unwrap();
        let xf = f32s(&x);
        for ((w, y), &n) in ws.iter().zip(&ys).zip(rows) {
            let wf = f32s(w);
            let reference: Vec<f32> = (0..m * n)
                .map(|i| (0..k).map(|j| f64::from(xf[(i / n) * k + j]) * f64::from(wf[(i % n) * k + j])).sum::<f64>() as f32)
                .collect();
            let err = rel_err(&g.stream.clone_dtoh(y).unwrap(), &reference);
            assert!(err < TOLERANCE, "{m}x{n}x{k} of jobs {rows:?}: rel err {err}");
        }
    }
    let (w, x) = (g.stream.clone_htod(&random(4 * 12, 30, 1.0)).unwrap(), g.stream.clone_htod(&random(9 * 16, 31, 1.0)).unwrap());
    let mut y = poisoned(&g, 9 * 4);
    let err = g.gemv_jobs(&x, 1, 12, &mut [(&w, &mut y, 4)]).unwrap_err();
    assert!(err.to_string().contains("k = 12"), "{err}");
    let err = g.gemv_jobs(&x, 9, 16, &mut [(&w, &mut y, 2)]).unwrap_err();
    assert!(err.to_string().contains("9 rows"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU; tools/gpu-check.sh runs it with --include-ignored"]
fn host_reads_through_reused_staging_return_exactly_the_values_asked_for() {
    let g = gpu();
    let values: Vec<f32> = (0..3_000_000).map(|i| (i as f32 * 0.37).sin()).collect();
    let src = g.stream.clone_htod(&values).unwrap();
    // Growing (a new staging buffer), shrinking (the same one, longer than
    // the copy), growing again, and nothing.
    for n in [10, 300_000, 7, 3_000_000, 0] {
        let got = g.read_host(&src, n, |host| host.to_vec()).unwrap();
        assert_eq!(got, values[..n], "first {n} values");
    }
    let err = g.read_host(&src, 3_000_001, |host| host.len()).unwrap_err();
    assert!(err.to_string().contains("holds 3000000 values"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU; tools/gpu-check.sh runs it with --include-ignored"]
fn rope_tables_match_the_cpu_in_both_layouts() {
    let g = gpu();
    let (tokens, heads, head_dim) = (3, 5, 64);
    let half = head_dim / 2;
    let x = random(tokens * heads * head_dim, 16, 2.0);
    let angles: Vec<f32> = (0..tokens * half).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
    let (cos, sin): (Vec<f32>, Vec<f32>) = angles.iter().map(|a| (a.cos(), a.sin())).unzip();
    for interleaved in [false, true] {
        let mut dx = g.stream.clone_htod(&x).unwrap();
        g.rope_table(&mut dx, &g.stream.clone_htod(&cos).unwrap(), &g.stream.clone_htod(&sin).unwrap(), tokens, heads, head_dim, interleaved).unwrap();
        let mut reference = f32s(&x);
        for t in 0..tokens {
            for h in 0..heads {
                let base = (t * heads + h) * head_dim;
                for i in 0..half {
                    let (ia, ib) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
                    let (a, b) = (x[base + ia].to_f32(), x[base + ib].to_f32());
                    reference[base + ia] = a * cos[t * half + i] - b * sin[t * half + i];
                    reference[base + ib] = a * sin[t * half + i] + b * cos[t * half + i];
                }
            }
        }
        let err = rel_err(&g.stream.clone_dtoh(&dx).unwrap(), &reference);
        assert!(err < TOLERANCE, "interleaved {interleaved}: rel err {err}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU; tools/gpu-check.sh runs it with --include-ignored"]
fn gated_activations_and_scaling_match_the_cpu() {
    let g = gpu();
    for n in [1, 255, 257, 70_000] {
        let (gate, up) = (random(n, 31, 4.0), random(n, 32, 2.0));
        let (dg, du) = (g.stream.clone_htod(&gate).unwrap(), g.stream.clone_htod(&up).unwrap());
        let (gf, uf) = (f32s(&gate), f32s(&up));
        let gelu: Vec<f32> = gf.iter().zip(&uf).map(|(&x, &u)| {
            let x = f64::from(x);
            (0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh()) * f64::from(u)) as f32
        }).collect();
        let silu: Vec<f32> = gf.iter().zip(&uf).map(|(&x, &u)| x / (1.0 + (-x).exp()) * u).collect();
        let mut out = poisoned(&g, n);
        g.gelu_tanh_mul(&mut out, &dg, &du, n).unwrap();
        let err = rel_err(&g.stream.clone_dtoh(&out).unwrap(), &gelu);
        assert!(err < TOLERANCE, "gelu_tanh n {n}: rel err {err}");
        let mut out = poisoned(&g, n);
        g.silu_mul(&mut out, &dg, &du, n).unwrap();
        let err = rel_err(&g.stream.clone_dtoh(&out).unwrap(), &silu);
        assert!(err < TOLERANCE, "silu n {n}: rel err {err}");
        let mut x = g.stream.clone_htod(&up).unwrap();
        g.scale(&mut x, 25.3, n).unwrap();
        let scaled: Vec<f32> = uf.iter().map(|u| u * 25.3).collect();
        let err = rel_err(&g.stream.clone_dtoh(&x).unwrap(), &scaled);
        assert!(err < TOLERANCE, "scale n {n}: rel err {err}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU; tools/gpu-check.sh runs it with --include-ignored"]
fn paged_prefill_matches_the_cpu_causally_over_cached_prefixes_and_windows() {
    use spindle_kernels::device::PrefillShape;
    let g = gpu();
    // (cached prefix, new tokens) per sequence: a lone token, tiles that
    // split unevenly, a long cached prefix, exactly one tile.
    let seqs_spec: [(usize, usize); 5] = [(0, 1), (0, 67), (37, 130), (250, 5), (5, 64)];
    for (heads, kv_heads, head_dim, block_size) in [(4, 2, 64, 16), (8, 8, 128, 16), (6, 2, 16, 32), (4, 1, 256, 16), (2, 1, 80, 16), (2, 1, 72, 16)] {
        let seqs = seqs_spec.len();
        let max_blocks = seqs_spec.iter().map(|(p, n)| (p + n).div_ceil(block_size)).max().unwrap();
        let num_blocks = seqs * max_blocks + 3;
        let kv_dim = kv_heads * head_dim;
        let tables: Vec<i32> = (0..seqs * max_blocks).map(|i| ((i * 7919 + 5) % num_blocks) as i32).collect();
        let kc = random(num_blocks * block_size * kv_dim, 21, 1.0);
        let vc = random(num_blocks * block_size * kv_dim, 22, 1.0);
        let tokens: usize = seqs_spec.iter().map(|(_, n)| n).sum();
        let q = random(tokens * heads * head_dim, 23, 2.0);
        let mut q_starts = vec![0i32];
        for (_, n) in seqs_spec {
            q_starts.push(q_starts.last().unwrap() + n as i32);
        }
        let start_pos: Vec<i32> = seqs_spec.iter().map(|(p, _)| *p as i32).collect();
        let shape = PrefillShape {
            seqs,
            tokens,
            max_new: seqs_spec.iter().map(|(_, n)| *n).max().unwrap(),
            heads,
            kv_heads,
            head_dim,
            block_size,
            max_blocks,
        };
        let scale = 1.0 / (head_dim as f32).sqrt();
        // No window; one token; windows that end inside a key tile, that
        // skip whole tiles of the long prefix, and wider than any context.
        for window in [None, Some(1), Some(70), Some(130), Some(1000)] {
            let mut out = poisoned(&g, tokens * heads * head_dim);
            let dev = |v: &[i32]| g.stream.clone_htod(v).unwrap();
            let (dk, dv, dq) = (g.stream.clone_htod(&kc).unwrap(), g.stream.clone_htod(&vc).unwrap(), g.stream.clone_htod(&q).unwrap());
            let result = g.paged_prefill(&mut out, &dq, &dk, &dv, &dev(&tables), &dev(&q_starts), &dev(&start_pos), shape, scale, window);
            if !PrefillShape::supports_head_dim(head_dim) {
                let err = result.unwrap_err();
                assert!(err.to_string().contains("multiple of 16"), "{err}");
                continue;
            }
            result.unwrap();
            let got = g.stream.clone_dtoh(&out).unwrap();
            let (kf, vf, qf) = (f32s(&kc), f32s(&vc), f32s(&q));
            let mut reference = vec![0.0f32; tokens * heads * head_dim];
            for (s, (prefix, n)) in seqs_spec.iter().enumerate() {
                let table = &tables[s * max_blocks..(s + 1) * max_blocks];
                for i in 0..*n {
                    let row = q_starts[s] as usize + i;
                    for h in 0..heads {
                        let at = (row * heads + h) * head_dim;
                        let o = attend_reference(&qf[at..at + head_dim], &kf, &vf, table, prefix + i + 1, window, h / (heads / kv_heads), kv_dim, block_size, scale);
                        reference[at..at + head_dim].copy_from_slice(&o);
                    }
                }
            }
            let err = rel_err(&got, &reference);
            assert!(err < TOLERANCE, "heads {heads}/{kv_heads} head_dim {head_dim} window {window:?}: rel err {err}");
            // The worst single row too, so one wrong tile cannot hide in the norm.
            for row in 0..tokens * heads {
                let r = &reference[row * head_dim..(row + 1) * head_dim];
                let e = rel_err(&got[row * head_dim..(row + 1) * head_dim], r);
                assert!(e < 3.0 * TOLERANCE, "head_dim {head_dim} window {window:?}: row {row} (token {}, head {}) rel err {e}", row / heads, row % heads);
            }
        }
    }
}

/// The distribution the host sampler draws from: p = exp((l - max) / t),
/// then top-k, top-p on the top-k mass, min-p; normalized.
fn truncated_distribution(logits: &[f32], t: f32, top_k: usize, top_p: f32, min_p: f32) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let p: Vec<f64> = logits.iter().map(|&l| ((f64::from(l) - f64::from(max)) / f64::from(t)).exp()).collect();
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
    let mut keep = if top_k > 0 && top_k < p.len() { top_k } else { p.len() };
    let mass_k: f64 = order[..keep].iter().map(|&i| p[i]).sum();
    if top_p < 1.0 {
        let mut acc = 0.0;
        for (n, &i) in order[..keep].iter().enumerate() {
            acc += p[i];
            if acc >= f64::from(top_p) * mass_k {
                keep = n + 1;
                break;
            }
        }
    }
    keep = order[..keep].iter().take_while(|&&i| p[i] >= f64::from(min_p)).count().max(1);
    let total: f64 = order[..keep].iter().map(|&i| p[i]).sum();
    let mut q = vec![0.0; p.len()];
    for &i in &order[..keep] {
        q[i] = p[i] / total;
    }
    q
}

#[test]
#[ignore = "needs a CUDA GPU; tools/gpu-check.sh runs it with --include-ignored"]
fn sampling_on_the_device_draws_the_host_samplers_distribution() {
    use spindle_kernels::device::RowSampling;
    let g = gpu();
    // 5003 ids (five per thread, not a multiple of the block); bf16-rounded
    // logits tie often, so the cuts must break ties by id as the host does.
    let vocab = 5003;
    let varied: Vec<f32> = f32s(&random(vocab, 31, 6.0));
    let flat = vec![0.5f32; vocab];
    // A sweep of uniforms turns the draw into its quantile function: each
    // token must come up in proportion to its probability, within 1/N, and
    // each draw must land in its token's interval of the id-ordered CDF.
    let n = 4000;
    let cases: [(&[f32], f32, usize, f32, f32); 8] = [
        (&varied, 0.7, 0, 1.0, 0.0),
        (&varied, 1.0, 50, 1.0, 0.0),
        (&varied, 1.3, 0, 0.9, 0.0),
        (&varied, 1.0, 0, 1.0, 0.05),
        (&varied, 0.8, 100, 0.8, 0.01),
        (&varied, 1.0, 3, 1.0, 0.0),
        (&flat, 1.0, 3, 1.0, 0.0),
        (&flat, 1.0, 0, 0.5, 0.0),
    ];
    for (logits, t, top_k, top_p, min_p) in cases {
        let mut d = g.stream.clone_htod(&logits.repeat(n)).unwrap();
        // Rows in a scrambled order, so a kernel reading row i for block i fails.
        let rows: Vec<RowSampling> = (0..n)
            .map(|i| RowSampling::plain((i * 7 + 3) % n, t, top_k, top_p, min_p, (i as f64 + 0.5) / n as f64))
            .collect();
        let got = g.sample_rows(&mut d, vocab, &rows).unwrap();
        let expected = truncated_distribution(logits, t, top_k, top_p, min_p);
        let case = format!("t {t} k {top_k} p {top_p} min_p {min_p} flat {}", logits[0] == logits[1]);
        let mut counts = vec![0usize; vocab];
        let mut cdf = vec![0.0f64; vocab + 1];
        for (tok, q) in expected.iter().enumerate() {
            cdf[tok + 1] = cdf[tok] + q;
        }
        for (r, s) in rows.iter().zip(&got) {
            let tok = s.token as usize;
            counts[tok] += 1;
            assert!(r.uniform >= cdf[tok] - 1e-4 && r.uniform <= cdf[tok + 1] + 1e-4, "{case}: u {} drew {tok}, whose interval is [{}, {})", r.uniform, cdf[tok], cdf[tok + 1]);
        }
        let log_z = {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            f64::from(max) + logits.iter().map(|&l| f64::from(l - max).exp()).sum::<f64>().ln()
        };
        for (tok, (&c, &q)) in counts.iter().zip(&expected).enumerate() {
            let share = c as f64 / n as f64;
            assert!((share - q).abs() <= 2.0 / n as f64 + 2e-3, "{case}: token {tok} drawn {share:.4}, expected {q:.4}");
            assert!(q > 0.0 || c == 0, "{case}: token {tok} is outside the kept set but was drawn {c} times");
        }
        for s in got.iter().take(50) {
            let want = f64::from(logits[s.token as usize]) - log_z;
            assert!((f64::from(s.logprob) - want).abs() < 1e-3, "{case}: logprob {} vs {want}", s.logprob);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU; tools/gpu-check.sh runs it with --include-ignored"]
fn greedy_sampling_on_the_device_takes_the_lowest_argmax_and_sanitizes() {
    use spindle_kernels::device::RowSampling;
    let g = gpu();
    let vocab = 5000;
    let mut rows = Vec::new();
    let mut data = Vec::new();
    // A tie (lowest id wins), NaNs (never chosen), +inf (taken as the max), all -inf (uniform: id 0).
    let mut tie = f32s(&random(vocab, 41, 3.0));
    tie[17] = 9.0;
    tie[4000] = 9.0;
    let mut nan = f32s(&random(vocab, 42, 3.0));
    nan[3] = f32::NAN;
    nan[99] = 8.5;
    let mut inf = f32s(&random(vocab, 43, 3.0));
    inf[2500] = f32::INFINITY;
    let flat = vec![f32::NEG_INFINITY; vocab];
    let expected = [17u32, 99, 2500, 0];
    for (i, row) in [tie, nan, inf, flat].into_iter().enumerate() {
        data.extend_from_slice(&row);
        rows.push(RowSampling::plain(i, if i % 2 == 0 { 0.0 } else { 0.7 }, if i % 2 == 0 { 0 } else { 1 }, 1.0, 0.0, 0.3));
    }
    let mut d = g.stream.clone_htod(&data).unwrap();
    let got = g.sample_rows(&mut d, vocab, &rows).unwrap();
    let tokens: Vec<u32> = got.iter().map(|s| s.token).collect();
    assert_eq!(tokens, expected);
    let uniform = -(vocab as f32).ln();
    assert!((got[3].logprob - uniform).abs() < 1e-4, "all -inf is uniform: {}", got[3].logprob);
    assert!(got.iter().all(|s| s.logprob.is_finite() && s.logprob <= 0.0), "{got:?}");
    assert!(g.sample_rows(&mut d, vocab, &[rows[0].clone(), rows[0].clone()]).is_err(), "a row listed twice is refused");
}

#[test]
#[ignore = "needs a CUDA GPU; tools/gpu-check.sh runs it with --include-ignored"]
fn the_device_sampler_applies_grammar_masks_and_penalties_as_the_host_does() {
    use spindle_kernels::device::RowSampling;
    let g = gpu();
    let vocab = 3001;
    let base: Vec<f32> = f32s(&random(vocab, 51, 4.0));
    let order = |l: &[f32]| {
        let mut o: Vec<usize> = (0..l.len()).collect();
        o.sort_by(|&a, &b| l[b].total_cmp(&l[a]));
        o
    };
    let top = order(&base);
    // A mask forbidding the three best tokens and every id above 2000.
    let mut mask = vec![0u32; vocab.div_ceil(32)];
    for t in 0..=2000 {
        if !top[..3].contains(&t) {
            mask[t / 32] |= 1 << (t % 32);
        }
    }
    // Penalties: the best token seen in the prompt (repetition 2.0), the second
    // three times in the output (frequency 0.5, presence 0.25).
    let mut seen = vec![(top[0] as u32, 0u32), (top[1] as u32, 3u32)];
    seen.sort_unstable();
    let penalize = |l: &mut [f32]| {
        for &(t, c) in &seen {
            let v = &mut l[t as usize];
            *v = if *v > 0.0 { *v / 2.0 } else { *v * 2.0 };
            if c > 0 {
                *v -= 0.5 * c as f32 + 0.25;
            }
        }
    };
    let apply = |l: &mut [f32], mask: &[u32]| {
        for (t, v) in l.iter_mut().enumerate() {
            if mask[t / 32] >> (t % 32) & 1 == 0 {
                *v = f32::NEG_INFINITY;
            }
        }
    };
    let mut masked = base.clone();
    apply(&mut masked, &mask);
    let mut penalized = base.clone();
    penalize(&mut penalized);
    // A second mask (only odd ids) with the penalties on top: both at once.
    let mut odd = vec![0u32; vocab.div_ceil(32)];
    for t in (1..vocab).step_by(2) {
        odd[t / 32] |= 1 << (t % 32);
    }
    let mut both = base.clone();
    apply(&mut both, &odd);
    penalize(&mut both);
    let with_penalties = |r: RowSampling| RowSampling { repetition_penalty: 2.0, presence_penalty: 0.25, frequency_penalty: 0.5, seen: seen.clone(), ..r };
    // Logits rows in a scrambled order: block i samples rows[i].row.
    let rows = vec![
        RowSampling { mask: Some(mask.clone()), ..RowSampling::plain(3, 0.0, 0, 1.0, 0.0, 0.5) },
        with_penalties(RowSampling::plain(0, 0.0, 0, 1.0, 0.0, 0.5)),
        // Sampled under the mask: every draw must be allowed.
        RowSampling { mask: Some(mask.clone()), ..RowSampling::plain(1, 1.5, 0, 1.0, 0.0, 0.999) },
        with_penalties(RowSampling { mask: Some(odd.clone()), ..RowSampling::plain(2, 0.0, 0, 1.0, 0.0, 0.5) }),
    ];
    let mut d = g.stream.clone_htod(&base.repeat(4)).unwrap();
    let got = g.sample_rows(&mut d, vocab, &rows).unwrap();
    let log_softmax = |l: &[f32], t: usize| {
        let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        f64::from(l[t] - max) - l.iter().filter(|v| v.is_finite()).map(|&v| f64::from(v - max).exp()).sum::<f64>().ln()
    };
    for (k, (want, what)) in [(&masked, "greedy under the mask"), (&penalized, "greedy after the penalties")].into_iter().enumerate() {
        assert_eq!(got[k].token as usize, order(want)[0], "{what}");
        assert!((f64::from(got[k].logprob) - log_softmax(want, got[k].token as usize)).abs() < 1e-3, "{what}: logprob");
    }
    assert_eq!(got[3].token as usize, order(&both)[0], "greedy under a mask and penalties");
    assert!((f64::from(got[3].logprob) - log_softmax(&both, got[3].token as usize)).abs() < 1e-3, "mask and penalties: logprob");
    let t = got[2].token as usize;
    assert!(t <= 2000 && !top[..3].contains(&t), "a sampled token the mask forbids: {t}");
    assert!(g.sample_rows(&mut d, vocab, &[RowSampling { seen: vec![(5, 1), (5, 2)], ..RowSampling::plain(0, 0.0, 0, 1.0, 0.0, 0.5) }]).is_err(), "repeated penalty tokens are refused");
}
