//! Each kernel against a CPU reference on the GPU: random inputs, several
//! shapes including odd sizes, outputs poisoned with NaN before the launch,
//! and ‖out − ref‖ / ‖ref‖ within bf16 tolerance. Skipped (with the reason
//! printed) where there is no CUDA driver or device.
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use half::bf16;
use spindle_kernels::device::{driver_present, Gpu};

/// bf16 keeps 8 significant bits; outputs are rounded once.
const TOLERANCE: f64 = 1e-2;

fn gpu() -> Option<Gpu> {
    if !driver_present() {
        println!("skipped: no CUDA driver on this machine (libcuda.so not found)");
        return None;
    }
    match Gpu::open(0) {
        Ok(g) => Some(g),
        Err(e) => {
            println!("skipped: {e}");
            None
        }
    }
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
fn add_rmsnorm_matches_the_cpu_with_and_without_the_residual() {
    let Some(g) = gpu() else { return };
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
fn silu_mul_matches_the_cpu() {
    let Some(g) = gpu() else { return };
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
fn embedding_gathers_rows_and_zeroes_unknown_ids() {
    let Some(g) = gpu() else { return };
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
fn rope_matches_the_cpu() {
    let Some(g) = gpu() else { return };
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
fn no_driver_is_an_error_not_a_panic() {
    if driver_present() {
        println!("skipped: a CUDA driver is present, so the no-driver path cannot be shown here");
        return;
    }
    let err = Gpu::open(0).unwrap_err();
    assert!(err.to_string().contains("no CUDA driver"), "{err}");
}
