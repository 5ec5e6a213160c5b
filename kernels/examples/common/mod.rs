//! What the GPU benchmarks share: non-zero inputs and the timing of rounds
//! of back-to-back calls.

use half::bf16;
use spindle_kernels::device::Gpu;
use std::time::Instant;

/// Bytes of inputs a measurement rotates over (well past a 60 MB L2).
pub const ROTATE_BYTES: usize = 256 << 20;
const ROUNDS: usize = 5;
const CALLS: usize = 20;

/// A benchmark's error.
pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Values of ±0.5 in a fixed hash pattern (not zeros: they can run faster).
pub fn pattern(n: usize, salt: usize) -> Vec<bf16> {
    (0..n).map(|i| bf16::from_f32((((i ^ salt).wrapping_mul(2_654_435_761) >> 12) & 0xff) as f32 / 256.0 - 0.5)).collect()
}

/// Per-call median and spread (seconds) of `call(i)` over 5 rounds of 20
/// back-to-back calls, after a warm-up round; `i` counts the calls, for
/// rotating over inputs.
pub fn time_calls(g: &Gpu, mut call: impl FnMut(usize) -> Result<()>) -> Result<(f64, f64)> {
    let mut rounds = Vec::new();
    for round in 0..=ROUNDS {
        g.stream.synchronize()?;
        let start = Instant::now();
        for i in 0..CALLS {
            call(round * CALLS + i)?;
        }
        g.stream.synchronize()?;
        if round > 0 {
            rounds.push(start.elapsed().as_secs_f64() / CALLS as f64);
        }
    }
    rounds.sort_by(f64::total_cmp);
    Ok((rounds[rounds.len() / 2], rounds[rounds.len() - 1] - rounds[0]))
}
