//! Test inputs shared by the K-quant kernels' tests: a deterministic
//! generator and rows of random super-blocks with finite float scales.

use crate::gguf::types::GgmlType;

/// The next value of a 64-bit linear congruential generator (high bits).
pub(crate) fn lcg(seed: &mut u64) -> u32 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (*seed >> 33) as u32
}

/// A row of `nb` super-blocks of a K-quant `dtype`: random bytes (every
/// integer scale and value), or all `fill` (the extremes), with finite
/// float scales.
pub(crate) fn random_row(dtype: GgmlType, nb: usize, fill: Option<u8>, seed: &mut u64) -> Vec<u8> {
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
