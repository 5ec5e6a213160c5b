//! The linear-layer GEMMs side by side on the GPU: cuBLAS against Spindle's
//! own kernels (skinny, tensor-core WMMA) on Llama-3.1-8B's layer
//! shapes, at decode (1, 8, 64, 256 rows) and prefill (512, 4096) sizes:
//! `cargo run --release -p spindle-kernels --features cuda --example gemm_bench`
//! (or the prebuilt binary, as `tools/gpu-check.sh` runs it).
//!
//! Each line: the median of 20 synchronized calls after 3 warm-ups, as
//! TFLOP/s and as GB/s of weights streamed (what bounds decode). Without a
//! GPU it says so and exits 0; without cuBLAS its column says why.

use half::bf16;
use spindle_kernels::device::{driver_present, GemmKernel, Gpu};
use std::time::Instant;

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
    println!(
        "device: {}; {}",
        g.name().unwrap_or_default(),
        g.gemm_backend()
    );
    println!(
        "{:>8} {:>6} {:>10} {:>10} {:>10} {:>9} {:>9}",
        "layer", "m", "kernel", "median_us", "spread_us", "TFLOP/s", "GB/s_w"
    );
    for (name, n, k) in LAYERS {
        for m in [1, 8, 64, 256, 512, 4096] {
            let mut kernels = vec![GemmKernel::Spindle, GemmKernel::TensorCore];
            if g.has_cublas() {
                kernels.insert(0, GemmKernel::Cublas);
            }
            if m > 8 {
                // Past 8 rows Spindle's choice is the tensor-core kernel.
                kernels.retain(|&k| k != GemmKernel::Spindle);
            }
            for kernel in kernels {
                if let Err(e) = run(&g, kernel, name, m, n, k) {
                    println!("{name:>8} {m:>6} {:>10} failed: {e}", format!("{kernel:?}"));
                }
            }
        }
    }
}

fn run(
    g: &Gpu,
    kernel: GemmKernel,
    name: &str,
    m: usize,
    n: usize,
    k: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let x = g.stream.clone_htod(&vec![bf16::from_f32(0.01); m * k])?;
    let w = g.stream.clone_htod(&vec![bf16::from_f32(0.02); n * k])?;
    let mut y = g.stream.alloc_zeros::<bf16>(m * n)?;
    let mut times = Vec::new();
    for i in 0..23 {
        g.stream.synchronize()?;
        let start = Instant::now();
        g.gemm_with(kernel, &mut y, &x, &w, m, n, k)?;
        g.stream.synchronize()?;
        if i >= 3 {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    let (median, spread) = (times[times.len() / 2], times[times.len() - 1] - times[0]);
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
