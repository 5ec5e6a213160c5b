//! K-quant (Q4_K, Q5_K, Q6_K) integer dot products.
//!
//! K-quants pack 256 weights into a super-block with one f16 scale (and, for
//! Q4_K/Q5_K, one f16 min scale) and small integer scales per 32 (Q4_K,
//! Q5_K) or 16 (Q6_K) weights. Activations for these layers are quantized
//! per 256 values too ([`Q8KBlock`], llama.cpp's `block_q8_K`): then the whole
//! super-block reduces to exact integers,
//!
//! * `isum = Σ_j sc_j · Σ_{i∈j} u_i·q_i` (Q6_K: minus `32·Σ_g sc_g·bsum_g`), and
//! * `msum = Σ_j m_j · Σ_{i∈j} q_i` (Q4_K, Q5_K: the sub-block mins),
//!
//! and the row's float accumulator takes `acc = fma(d_x·d, isum, acc)` then,
//! with mins, `acc = fma(−(d_x·dmin), msum, acc)`. Every kernel here (scalar,
//! AVX2, one or four tokens) computes those integers exactly and applies the
//! same IEEE operations in the same order, so a token's result never depends
//! on the kernel or the batch that computed it.

use super::dequant::QK_K;
use super::dot::round_half_away;
use crate::gguf::types::GgmlType;

/// 256 activations quantized to i8 with one f32 scale and the sums of each
/// 16 quantized values (for the mins and Q6_K's offset).
#[derive(Debug, Clone, Copy)]
#[repr(C, align(32))]
pub struct Q8KBlock {
    /// The quantized values.
    pub qs: [i8; QK_K],
    /// `Σ qs[16g..16g+16]` for g in 0..16.
    pub bsums: [i16; 16],
    /// Scale: value = d · q.
    pub d: f32,
}

impl Default for Q8KBlock {
    fn default() -> Self {
        Self { qs: [0; QK_K], bsums: [0; 16], d: 0.0 }
    }
}

/// Quantize `x` (a multiple of 256 long) into `out` (`x.len() / 256` blocks):
/// `d = max|x| / 127`, `q = round(x / d)` (halves away from zero), as
/// [`super::dot::quantize_row_q8_scalar`] does per 32.
pub fn quantize_row_q8k(x: &[f32], out: &mut [Q8KBlock]) {
    if crate::quant::quantize_avx512::available() {
        crate::quant::quantize_avx512::quantize_row_k(x, out)
    } else {
        quantize_row_q8k_scalar(x, out)
    }
}

/// [`quantize_row_q8k`] in portable code: the definition the SIMD version
/// reproduces bit for bit.
pub fn quantize_row_q8k_scalar(x: &[f32], out: &mut [Q8KBlock]) {
    for (chunk, block) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = crate::quant::dot::inverse_scale(d);
        for (q, v) in block.qs.iter_mut().zip(chunk) {
            *q = round_half_away(v * inv).clamp(-127, 127) as i8;
        }
        for (s, group) in block.bsums.iter_mut().zip(block.qs.chunks_exact(16)) {
            *s = group.iter().map(|&q| q as i16).sum();
        }
        block.d = d;
    }
}

/// One weight row (raw super-blocks) · one token.
pub type KDotFn = fn(&[u8], &[Q8KBlock]) -> f32;

/// One weight row · four tokens `stride` blocks apart (`x[j * stride..]` is token j).
pub type KDot4Fn = fn(&[u8], &[Q8KBlock], usize) -> [f32; 4];

/// Four weight rows · one token.
pub type KRows4Fn = fn([&[u8]; 4], &[Q8KBlock]) -> [f32; 4];

/// Four weight rows · `out.len()` tokens of `nb` super-blocks each, one after
/// another in the activations: `out[t][r]`.
pub type KRows4TokensFn = fn([&[u8]; 4], &[Q8KBlock], usize, &mut [[f32; 4]]);

/// The kernels for one K-quant type.
#[derive(Clone, Copy)]
pub struct KDotKernels {
    /// One row · one token.
    pub one: KDotFn,
    /// One row · four tokens (the weights are unpacked once for all four).
    pub four: KDot4Fn,
    /// Four rows · one token (decode: four independent chains in flight).
    pub rows4: KRows4Fn,
    /// Four rows · a few tokens, each row unpacked once for all of them
    /// (batched decode), where this CPU has such a kernel.
    pub rows4_tokens: Option<KRows4TokensFn>,
}

/// Whether `dtype` is a K-quant with kernels here.
pub fn is_kquant(dtype: GgmlType) -> bool {
    matches!(dtype, GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K)
}

/// The fastest kernels for a K-quant type on this CPU (`None` for other types).
pub fn kdot_kernels(dtype: GgmlType) -> Option<KDotKernels> {
    #[cfg(target_arch = "x86_64")]
    if vnni4::available() {
        match dtype {
            GgmlType::Q4K => return Some(KDotKernels { one: vnni::dot_q4_k, four: avx2::dot4_q4_k, rows4: vnni4::rows4_q4_k, rows4_tokens: Some(vnni4::rows4_tokens_q4_k) }),
            GgmlType::Q6K => return Some(KDotKernels { one: vnni::dot_q6_k, four: avx2::dot4_q6_k, rows4: vnni4::rows4_q6_k, rows4_tokens: Some(vnni4::rows4_tokens_q6_k) }),
            _ => {}
        }
    }
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        return Some(match dtype {
            GgmlType::Q4K => KDotKernels { one: avx2::dot_q4_k, four: avx2::dot4_q4_k, rows4: avx2::rows4_q4_k, rows4_tokens: None },
            GgmlType::Q5K => KDotKernels { one: avx2::dot_q5_k, four: avx2::dot4_q5_k, rows4: avx2::rows4_q5_k, rows4_tokens: None },
            GgmlType::Q6K => KDotKernels { one: avx2::dot_q6_k, four: avx2::dot4_q6_k, rows4: avx2::rows4_q6_k, rows4_tokens: None },
            _ => return None,
        });
    }
    scalar_kdot_kernels(dtype)
}

/// The portable kernels (the definition the SIMD ones must match bit for bit).
pub fn scalar_kdot_kernels(dtype: GgmlType) -> Option<KDotKernels> {
    let one: KDotFn = match dtype {
        GgmlType::Q4K => scalar::dot_q4_k,
        GgmlType::Q5K => scalar::dot_q5_k,
        GgmlType::Q6K => scalar::dot_q6_k,
        _ => return None,
    };
    let four: KDot4Fn = match dtype {
        GgmlType::Q4K => |w, x, s| std::array::from_fn(|j| scalar::dot_q4_k(w, &x[j * s..(j + 1) * s])),
        GgmlType::Q5K => |w, x, s| std::array::from_fn(|j| scalar::dot_q5_k(w, &x[j * s..(j + 1) * s])),
        _ => |w, x, s| std::array::from_fn(|j| scalar::dot_q6_k(w, &x[j * s..(j + 1) * s])),
    };
    let rows4: KRows4Fn = match dtype {
        GgmlType::Q4K => |w, x| w.map(|r| scalar::dot_q4_k(r, x)),
        GgmlType::Q5K => |w, x| w.map(|r| scalar::dot_q5_k(r, x)),
        _ => |w, x| w.map(|r| scalar::dot_q6_k(r, x)),
    };
    Some(KDotKernels { one, four, rows4, rows4_tokens: None })
}

/// Bytes per super-block.
const Q4K_BYTES: usize = 144;
const Q5K_BYTES: usize = 176;
const Q6K_BYTES: usize = 210;

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// The 8 six-bit scales and 8 six-bit mins of a Q4_K/Q5_K super-block from
/// its 12 packed bytes (ggml's `get_scale_min_k4`, all 8 at once).
#[inline(always)]
fn scales_mins_k4(p: &[u8]) -> ([u8; 8], [u8; 8]) {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([p[4 * i], p[4 * i + 1], p[4 * i + 2], p[4 * i + 3]]);
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let sc = [w0 & K1, (w2 & K2) | (((w0 >> 6) & K3) << 4)];
    let mn = [w1 & K1, ((w2 >> 4) & K2) | (((w1 >> 6) & K3) << 4)];
    let bytes = |v: [u32; 2]| {
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&v[0].to_le_bytes());
        out[4..].copy_from_slice(&v[1].to_le_bytes());
        out
    };
    (bytes(sc), bytes(mn))
}

/// `Σ_j m_j · (bsums[2j] + bsums[2j+1])`: the mins' integer term.
#[inline(always)]
fn min_sum(mins: &[u8; 8], xb: &Q8KBlock) -> i32 {
    (0..8).map(|j| mins[j] as i32 * (xb.bsums[2 * j] as i32 + xb.bsums[2 * j + 1] as i32)).sum()
}

/// `32 · Σ_g sc_g · bsums[g]`: Q6_K's offset term.
#[inline(always)]
fn q6_offset(scales: &[u8], xb: &Q8KBlock) -> i32 {
    32 * (0..16).map(|g| (scales[g] as i8) as i32 * xb.bsums[g] as i32).sum::<i32>()
}

/// Portable reference kernels.
mod scalar {
    use super::*;

    /// Exact `Σ sc_j · Σ u·q` over 8 sub-blocks of 32 unsigned weights.
    fn scaled_sum(u: &[u8; QK_K], scales: &[u8; 8], xb: &Q8KBlock) -> i32 {
        (0..8)
            .map(|j| {
                let s: i32 = (32 * j..32 * j + 32).map(|i| u[i] as i32 * xb.qs[i] as i32).sum();
                scales[j] as i32 * s
            })
            .sum()
    }

    fn fold(acc: f32, xb: &Q8KBlock, d: f32, dmin: f32, isum: i32, msum: i32) -> f32 {
        let acc = (xb.d * d).mul_add(isum as f32, acc);
        (-(xb.d * dmin)).mul_add(msum as f32, acc)
    }

    pub fn dot_q4_k(w: &[u8], x: &[Q8KBlock]) -> f32 {
        let mut acc = 0f32;
        for (wb, xb) in w.chunks_exact(Q4K_BYTES).zip(x) {
            let (scales, mins) = scales_mins_k4(&wb[4..16]);
            let mut u = [0u8; QK_K];
            for c in 0..4 {
                for l in 0..32 {
                    let q = wb[16 + 32 * c + l];
                    u[64 * c + l] = q & 0x0F;
                    u[64 * c + 32 + l] = q >> 4;
                }
            }
            let isum = scaled_sum(&u, &scales, xb);
            acc = fold(acc, xb, f16_at(wb, 0), f16_at(wb, 2), isum, min_sum(&mins, xb));
        }
        acc
    }

    pub fn dot_q5_k(w: &[u8], x: &[Q8KBlock]) -> f32 {
        let mut acc = 0f32;
        for (wb, xb) in w.chunks_exact(Q5K_BYTES).zip(x) {
            let (scales, mins) = scales_mins_k4(&wb[4..16]);
            let mut u = [0u8; QK_K];
            for c in 0..4 {
                for l in 0..32 {
                    let (ql, qh) = (wb[48 + 32 * c + l], wb[16 + l]);
                    u[64 * c + l] = (ql & 0x0F) | (((qh >> (2 * c)) & 1) << 4);
                    u[64 * c + 32 + l] = (ql >> 4) | (((qh >> (2 * c + 1)) & 1) << 4);
                }
            }
            let isum = scaled_sum(&u, &scales, xb);
            acc = fold(acc, xb, f16_at(wb, 0), f16_at(wb, 2), isum, min_sum(&mins, xb));
        }
        acc
    }

    pub fn dot_q6_k(w: &[u8], x: &[Q8KBlock]) -> f32 {
        let mut acc = 0f32;
        for (wb, xb) in w.chunks_exact(Q6K_BYTES).zip(x) {
            let scales = &wb[192..208];
            let mut isum = 0i32;
            for n in 0..2 {
                let (ql, qh) = (&wb[64 * n..64 * n + 64], &wb[128 + 32 * n..160 + 32 * n]);
                for l in 0..32 {
                    let u = [
                        (ql[l] & 0x0F) | ((qh[l] & 3) << 4),
                        (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4),
                        (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                        (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                    ];
                    for (k, u) in u.into_iter().enumerate() {
                        let i = 128 * n + 32 * k + l;
                        isum += (scales[i / 16] as i8) as i32 * u as i32 * xb.qs[i] as i32;
                    }
                }
            }
            isum -= q6_offset(scales, xb);
            acc = (xb.d * f16_at(wb, 208)).mul_add(isum as f32, acc);
        }
        acc
    }
}

#[cfg(target_arch = "x86_64")]
pub mod amx;
#[cfg(target_arch = "x86_64")]
mod amx_runs;
#[cfg(target_arch = "x86_64")]
mod avx2;
pub mod gemm;
pub mod lanes;
#[cfg(test)]
pub(crate) mod test_rows;
#[cfg(target_arch = "x86_64")]
mod vnni;
#[cfg(target_arch = "x86_64")]
mod vnni4;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequant::dequantize;

    #[test]
    fn blocks_too_small_for_a_finite_inverse_scale_quantize_to_zeros() {
        for tiny in [1e-38f32, -1e-38, 3e-37] {
            let mut x = vec![0f32; QK_K];
            x[9] = tiny;
            let mut k = [Q8KBlock::default()];
            quantize_row_q8k_scalar(&x, &mut k);
            assert!(k[0].qs.iter().all(|&q| q == 0), "{tiny}: {:?}", &k[0].qs[..16]);
            let mut q8 = [crate::quant::dot::Q8Block::default(); QK_K / 32];
            crate::quant::dot::quantize_row_q8_scalar(&x, &mut q8);
            assert!(q8.iter().all(|b| b.qs.iter().all(|&q| q == 0) && b.qsum == 0), "{tiny}");
        }
    }

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    /// Random super-blocks with sane f16 scales (random bytes elsewhere).
    fn random_row(dtype: GgmlType, blocks: usize, seed: &mut u64) -> Vec<u8> {
        let ts = dtype.type_size();
        let mut w: Vec<u8> = (0..blocks * ts).map(|_| lcg(seed) as u8).collect();
        for b in w.chunks_exact_mut(ts) {
            let f = |v: f32| half::f16::from_f32(v).to_bits().to_le_bytes();
            let d = f(0.001 + (lcg(seed) % 100) as f32 / 20000.0);
            if dtype == GgmlType::Q6K {
                b[208..210].copy_from_slice(&d);
            } else {
                b[0..2].copy_from_slice(&d);
                b[2..4].copy_from_slice(&f(0.002 + (lcg(seed) % 100) as f32 / 30000.0));
            }
        }
        w
    }

    fn activations(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n).map(|_| (lcg(seed) % 4001) as f32 / 1000.0 - 2.0).collect()
    }

    const TYPES: [GgmlType; 3] = [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K];

    #[test]
    fn packed_scales_match_ggml_get_scale_min_k4() {
        let mut seed = 1u64;
        for _ in 0..1000 {
            let q: [u8; 12] = std::array::from_fn(|_| lcg(&mut seed) as u8);
            let (sc, mn) = scales_mins_k4(&q);
            for j in 0..8 {
                let want = if j < 4 {
                    (q[j] & 63, q[j + 4] & 63)
                } else {
                    ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
                };
                assert_eq!((sc[j], mn[j]), want, "sub-block {j} of {q:?}");
            }
        }
    }

    #[test]
    fn kernels_match_the_dequantized_dot_and_each_other() {
        let mut seed = 17u64;
        let cols = 4 * QK_K;
        let x = activations(cols, &mut seed);
        let mut xq = vec![Q8KBlock::default(); cols / QK_K];
        quantize_row_q8k(&x, &mut xq);
        let xdq: Vec<f32> = xq.iter().flat_map(|b| b.qs.iter().map(move |&q| q as f32 * b.d)).collect();
        for dtype in TYPES {
            for _ in 0..8 {
                let w = random_row(dtype, cols / QK_K, &mut seed);
                let mut wf = vec![0f32; cols];
                dequantize(dtype, &w, &mut wf).expect("dequantize");
                // Against the dequantized weights times the quantized activations
                // (f64): only the final float rounding differs.
                let exact: f64 = wf.iter().zip(&xdq).map(|(a, b)| *a as f64 * *b as f64).sum();
                let magnitude: f64 = wf.iter().zip(&xdq).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                let slow = (scalar_kdot_kernels(dtype).expect("scalar").one)(&w, &xq);
                let fast = (kdot_kernels(dtype).expect("kernel").one)(&w, &xq);
                assert_eq!(fast.to_bits(), slow.to_bits(), "{dtype:?}: SIMD {fast} vs scalar {slow}");
                assert!((slow as f64 - exact).abs() <= 1e-5 * magnitude + 1e-6, "{dtype:?}: {slow} vs {exact}");
                // And against f32 activations: within 8-bit activation noise.
                let full: f64 = wf.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
                assert!((slow as f64 - full).abs() <= 1e-2 * magnitude, "{dtype:?}: {slow} vs {full}");
            }
        }
    }

    #[test]
    fn four_token_and_four_row_kernels_equal_one_token_kernels_bit_for_bit() {
        let mut seed = 29u64;
        let nb = 3;
        let x = activations(4 * nb * QK_K, &mut seed);
        let mut xq = vec![Q8KBlock::default(); 4 * nb];
        quantize_row_q8k(&x, &mut xq);
        for dtype in TYPES {
            let w = random_row(dtype, nb, &mut seed);
            for k in [kdot_kernels(dtype), scalar_kdot_kernels(dtype)] {
                let k = k.expect("kernels");
                let four = (k.four)(&w, &xq, nb);
                for (j, got) in four.iter().enumerate() {
                    let one = (k.one)(&w, &xq[j * nb..(j + 1) * nb]);
                    assert_eq!(got.to_bits(), one.to_bits(), "{dtype:?} token {j}");
                }
                let rows: Vec<Vec<u8>> = (0..4).map(|_| random_row(dtype, nb, &mut seed)).collect();
                let by_rows = (k.rows4)([&rows[0], &rows[1], &rows[2], &rows[3]], &xq[..nb]);
                for (r, got) in by_rows.iter().enumerate() {
                    let one = (k.one)(&rows[r], &xq[..nb]);
                    assert_eq!(got.to_bits(), one.to_bits(), "{dtype:?} row {r}");
                }
            }
        }
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        // All weights at their largest magnitude, all scales at their largest,
        // activations at ±127: the integer sums stay exact.
        let x: Vec<f32> = (0..QK_K).map(|i| if i % 3 == 0 { -1.0 } else { 1.0 }).collect();
        let mut xq = [Q8KBlock::default()];
        quantize_row_q8k(&x, &mut xq);
        for dtype in TYPES {
            let mut w = vec![0xFFu8; dtype.type_size()];
            let f = half::f16::from_f32(0.5).to_bits().to_le_bytes();
            if dtype == GgmlType::Q6K {
                w[192..208].fill(0x80); // scales of -128
                w[208..210].copy_from_slice(&f);
            } else {
                w[0..2].copy_from_slice(&f);
                w[2..4].copy_from_slice(&f);
            }
            let mut wf = vec![0f32; QK_K];
            dequantize(dtype, &w, &mut wf).expect("dequantize");
            let exact: f64 = wf.iter().zip(&xq[0].qs).map(|(a, q)| *a as f64 * (*q as f64 * xq[0].d as f64)).sum();
            for k in [kdot_kernels(dtype), scalar_kdot_kernels(dtype)] {
                let got = (k.expect("kernels").one)(&w, &xq);
                assert!((got as f64 - exact).abs() <= 1e-5 * exact.abs().max(1.0), "{dtype:?}: {got} vs {exact}");
            }
        }
    }

    #[test]
    fn bsums_are_the_group_sums() {
        let mut seed = 3u64;
        let x = activations(QK_K, &mut seed);
        let mut xq = [Q8KBlock::default()];
        quantize_row_q8k(&x, &mut xq);
        for g in 0..16 {
            let s: i32 = xq[0].qs[16 * g..16 * g + 16].iter().map(|&q| q as i32).sum();
            assert_eq!(xq[0].bsums[g] as i32, s);
        }
        assert!(xq[0].qs.iter().all(|&q| q != i8::MIN));
    }
}
