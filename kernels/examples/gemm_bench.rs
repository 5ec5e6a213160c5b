//! The linear-layer GEMMs side by side on the GPU: cuBLAS against Spindle's
//! own kernels (skinny, tensor-core WMMA) on Llama-3.1-8B's layer
//! shapes, at decode (1, 8, 64, 256 rows) and prefill (512, 4096) sizes,
//! then the layers that share an input (q, k, v; gate, up) as separate
//! calls against one fused skinny launch:
//! `cargo run --release -p spindle-kernels --features cuda --example gemm_bench`
//! (or the prebuilt binary, as `tools/gpu-check.sh` runs it).
//!
//! Each line: the median over 5 rounds of 20 back-to-back calls (per call)
//! after a warm-up round, and the spread of the rounds, as TFLOP/s and as
//! GB/s of weights streamed (what bounds decode). The calls rotate over
//! copies of the weights that together exceed the GPU's L2, so the weights
//! come from memory. Without a GPU it says so and exits 0; without cuBLAS its
//! column says why.

mod common;

use common::{pattern, time_calls, Result, ROTATE_BYTES};
use cudarc::driver::CudaSlice;
use half::bf16;
use spindle_kernels::device::{driver_present, GemmKernel, GemvJob, Gpu};

/// (name, n, k) of the 8B model's linear layers, as the engine runs them
/// (q and o; k and v; gate and up; down).
const LAYERS: [(&str, usize, usize); 4] = [("q|o", 4096, 4096), ("k|v", 1024, 4096), ("gate|up", 14336, 4096), ("down", 4096, 14336)];
fn main() {
    if !driver_present() {
        println!("gemm_bench: skipped, no CUDA driver on this machine");
        return;
    }
    let g = match Gpu::open(0) {
        Ok(g) => g,
        Err(e) => {
            println!("gemm_bench: skipped, {e}");
            return;
        }
    };
    println!("device: {}; {}", g.name().unwrap_or_default(), g.gemm_backend());
    println!("{:>8} {:>6} {:>10} {:>10} {:>10} {:>9} {:>9}", "layer", "m", "kernel", "median_us", "spread_us", "TFLOP/s", "GB/s_w");
    for (name, n, k) in LAYERS {
        for m in [1, 2, 4, 8, 64, 256, 512, 4096] {
            let mut kernels = vec![GemmKernel::Spindle, GemmKernel::TensorCore];
            if g.has_cublas() {
                kernels.insert(0, GemmKernel::Cublas);
            }
            if m > 8 {
                // Past 8 rows Spindle's choice is the tensor-core kernel.
                kernels.retain(|&k| k != GemmKernel::Spindle);
            }
            if !(8..=64).contains(&m) {
                // The WMMA kernel is a fallback: timed where it would run.
                kernels.retain(|&k| k != GemmKernel::TensorCore);
            }
            for kernel in kernels {
                if let Err(e) = run(&g, kernel, name, m, n, k) {
                    println!("{name:>8} {m:>6} {:>10} failed: {e}", format!("{kernel:?}"));
                }
            }
        }
    }
    println!("\nlayers sharing an input: separate calls (Auto: what the engine runs by default) against one fused skinny launch");
    for (name, rows) in [("q,k,v", &[4096usize, 1024, 1024][..]), ("gate,up", &[14336, 14336][..])] {
        for m in [1, 8] {
            if let Err(e) = run_fused(&g, name, m, 4096, rows) {
                println!("{name:>8} {m:>6} failed: {e}");
            }
        }
    }
}

/// Copies of an `n × k` weight, enough to exceed the L2 together.
fn weight_copies(g: &Gpu, n: usize, k: usize) -> Result<Vec<CudaSlice<bf16>>> {
    let copies = ROTATE_BYTES.div_ceil(n * k * 2).max(2);
    let host = pattern(n * k, n);
    Ok((0..copies).map(|_| g.stream.clone_htod(&host)).collect::<std::result::Result<_, _>>()?)
}

fn run(g: &Gpu, kernel: GemmKernel, name: &str, m: usize, n: usize, k: usize) -> Result<()> {
    let x = g.stream.clone_htod(&pattern(m * k, 1))?;
    let ws = weight_copies(g, n, k)?;
    let mut y = g.stream.alloc_zeros::<bf16>(m * n)?;
    let (median, spread) = time_calls(g, |i| Ok(g.gemm_with(kernel, &mut y, &x, &ws[i % ws.len()], m, n, k)?))?;
    let flops = 2.0 * (m * n * k) as f64;
    let weight_bytes = (n * k * 2) as f64;
    println!(
        "{name:>8} {m:>6} {:>10} {:>10.1} {:>10.1} {:>9.1} {:>9.0}",
        format!("{kernel:?}"),
        median * 1e6,
        spread * 1e6,
        flops / median / 1e12,
        weight_bytes / median / 1e9
    );
    Ok(())
}

/// Layers of `rows` (each n × k) reading one x: separate Auto calls, then one fused launch.
fn run_fused(g: &Gpu, name: &str, m: usize, k: usize, rows: &[usize]) -> Result<()> {
    let x = g.stream.clone_htod(&pattern(m * k, 2))?;
    let ws: Vec<Vec<CudaSlice<bf16>>> = rows.iter().map(|&n| weight_copies(g, n, k)).collect::<Result<_>>()?;
    let mut ys: Vec<CudaSlice<bf16>> = rows.iter().map(|&n| g.stream.alloc_zeros::<bf16>(m * n)).collect::<std::result::Result<_, _>>()?;
    let weight_bytes = rows.iter().map(|n| n * k * 2).sum::<usize>() as f64;
    let separate = time_calls(g, |i| {
        for ((w, y), &n) in ws.iter().zip(ys.iter_mut()).zip(rows) {
            g.gemm(y, &x, &w[i % w.len()], m, n, k)?;
        }
        Ok(())
    })?;
    let fused = time_calls(g, |i| {
        let mut jobs: Vec<GemvJob<'_>> = ws.iter().zip(ys.iter_mut()).zip(rows).map(|((w, y), &n)| (&w[i % w.len()], y, n)).collect();
        Ok(g.gemv_jobs(&x, m, k, &mut jobs)?)
    })?;
    for (label, (median, spread)) in [("separate", separate), ("fused", fused)] {
        println!("{name:>8} {m:>6} {label:>10} {:>10.1} {:>10.1} {:>9} {:>9.0}", median * 1e6, spread * 1e6, "", weight_bytes / median / 1e9);
    }
    Ok(())
}
