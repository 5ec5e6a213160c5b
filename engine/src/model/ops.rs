//! Element-wise and normalisation ops shared by every model family.

use crate::config::{Llama3RopeScaling, ModelConfig, RopeStyle};
use crate::simd::fast_exp;

/// In-place RMSNorm of each `weight.len()`-wide row of `x`.
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    for row in x.chunks_exact_mut(dim) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for (v, w) in row.iter_mut().zip(weight) {
            *v = *v * inv * w;
        }
    }
}

/// RMSNorm of `x` into `out` (same shape), leaving `x` untouched.
pub fn rms_norm_into(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    out.copy_from_slice(x);
    rms_norm(out, weight, eps);
}

/// `out[i] = silu(gate[i]) · up[i]`, with [`fast_exp`] (relative error
/// about 2e-7) so the loop vectorizes: 16 lanes where the CPU has AVX-512,
/// 8 with AVX2, the same bits every way (no fused operations).
pub fn silu_mul(out: &mut [f32], gate: &[f32], up: &[f32]) {
    gated(out, gate, up, silu_times);
}

/// `silu(g) · u`.
#[inline(always)]
fn silu_times(g: f32, u: f32) -> f32 {
    g / (1.0 + fast_exp(-g)) * u
}

/// `out[i] = f(gate[i], up[i])`, compiled with AVX-512 or AVX2 where the
/// CPU has it (so that `f`, a function item inlined into the loop,
/// vectorizes 16 or 8 wide); the same bits every way.
#[inline(always)]
fn gated<F: Fn(f32, f32) -> f32>(out: &mut [f32], gate: &[f32], up: &[f32], f: F) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::use_avx512() {
        // SAFETY: AVX-512F (and AVX2/FMA/F16C) were detected.
        unsafe { gated_avx512(out, gate, up, f) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd::use_avx2() {
        // SAFETY: AVX2 was detected.
        unsafe { gated_avx2(out, gate, up, f) };
        return;
    }
    gated_lanes(out, gate, up, f);
}

/// [`gated`]'s loop, compiled for the caller's target features.
#[inline(always)]
fn gated_lanes<F: Fn(f32, f32) -> f32>(out: &mut [f32], gate: &[f32], up: &[f32], f: F) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = f(g, u);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn gated_avx2<F: Fn(f32, f32) -> f32>(out: &mut [f32], gate: &[f32], up: &[f32], f: F) {
    gated_lanes(out, gate, up, f);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
#[inline]
unsafe fn gated_avx512<F: Fn(f32, f32) -> f32>(out: &mut [f32], gate: &[f32], up: &[f32], f: F) {
    gated_lanes(out, gate, up, f);
}

/// `x[i] += y[i]`.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `gelu_tanh(gate) · up` elementwise into `out` (the tanh approximation,
/// as HF's `gelu_pytorch_tanh`), vectorized where the CPU allows.
pub fn gelu_tanh_mul(out: &mut [f32], gate: &[f32], up: &[f32]) {
    gated(out, gate, up, gelu_tanh_times);
}

/// `gelu_tanh(g) · u`: `0.5·(1 + tanh(y))` is `1 / (1 + e^(-2y))`, and
/// [`fast_exp`] (unlike libm's `tanhf`) vectorizes.
#[inline(always)]
fn gelu_tanh_times(g: f32, u: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let inner = SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g);
    g / (1.0 + fast_exp(-2.0 * inner)) * u
}

/// Precomputed RoPE inverse frequencies for one model.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    style: RopeStyle,
}

/// cos/sin of every (position, frequency) pair used by one forward pass.
#[derive(Debug)]
pub struct RopeAngles {
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeAngles {
    /// `[positions, head_dim / 2]` cosines.
    pub fn cos(&self) -> &[f32] {
        &self.cos
    }

    /// `[positions, head_dim / 2]` sines.
    pub fn sin(&self) -> &[f32] {
        &self.sin
    }
}

impl Rope {
    /// Frequencies from the model config (incl. Llama 3 scaling).
    pub fn new(config: &ModelConfig) -> Self {
        let mut rope = Self::with_base(config, config.rope_theta);
        if let Some(s) = &config.rope_scaling {
            llama3_scale(&mut rope.inv_freq, s);
        }
        rope
    }

    /// Unscaled frequencies of base `theta` for `config`'s heads (Gemma 3's
    /// local layers).
    pub fn with_base(config: &ModelConfig, theta: f32) -> Self {
        let half = config.head_dim / 2;
        let inv_freq = (0..half).map(|i| 1.0 / theta.powf(2.0 * i as f32 / config.head_dim as f32)).collect();
        Self { inv_freq, style: config.rope_style }
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.inv_freq.len() * 2
    }

    /// Whether pairs are adjacent (llama.cpp's normal mode) rather than halves.
    pub fn interleaved(&self) -> bool {
        self.style == RopeStyle::Interleaved
    }

    /// cos/sin tables for the given token positions.
    pub fn angles(&self, positions: &[usize]) -> RopeAngles {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for f in &self.inv_freq {
                let (s, c) = (p as f64 * *f as f64).sin_cos();
                cos.push(c as f32);
                sin.push(s as f32);
            }
        }
        RopeAngles { half, cos, sin }
    }

    /// Rotate every head of every token row of `x` (`[tokens, heads * head_dim]`).
    pub fn apply(&self, x: &mut [f32], angles: &RopeAngles, heads: usize) {
        self.apply_from(x, angles, heads, 0);
    }

    /// As [`Rope::apply`], for rows `first..` of the step (`x` starts at row `first`).
    pub fn apply_from(&self, x: &mut [f32], angles: &RopeAngles, heads: usize, first: usize) {
        let half = angles.half;
        let head_dim = half * 2;
        for (t, row) in x.chunks_exact_mut(heads * head_dim).enumerate() {
            let t = first + t;
            let cos = &angles.cos[t * half..(t + 1) * half];
            let sin = &angles.sin[t * half..(t + 1) * half];
            for head in row.chunks_exact_mut(head_dim) {
                match self.style {
                    RopeStyle::Interleaved => {
                        for i in 0..half {
                            let (a, b) = (head[2 * i], head[2 * i + 1]);
                            head[2 * i] = a * cos[i] - b * sin[i];
                            head[2 * i + 1] = a * sin[i] + b * cos[i];
                        }
                    }
                    RopeStyle::Neox => {
                        for i in 0..half {
                            let (a, b) = (head[i], head[i + half]);
                            head[i] = a * cos[i] - b * sin[i];
                            head[i + half] = a * sin[i] + b * cos[i];
                        }
                    }
                }
            }
        }
    }
}

fn llama3_scale(inv_freq: &mut [f32], s: &Llama3RopeScaling) {
    let old = s.original_max_position_embeddings as f32;
    let low_wavelen = old / s.low_freq_factor;
    let high_wavelen = old / s.high_freq_factor;
    for f in inv_freq.iter_mut() {
        let wavelen = 2.0 * std::f32::consts::PI / *f;
        if wavelen < high_wavelen {
            continue;
        }
        if wavelen > low_wavelen {
            *f /= s.factor;
        } else {
            let smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
            *f = (1.0 - smooth) * *f / s.factor + smooth * *f;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_rows() {
        let mut x = vec![3.0, 4.0];
        rms_norm(&mut x, &[1.0, 2.0], 0.0);
        let r = (12.5f32).sqrt();
        assert!((x[0] - 3.0 / r).abs() < 1e-6 && (x[1] - 8.0 / r).abs() < 1e-6);
    }

    #[test]
    fn silu_mul_is_within_fast_exps_error_and_the_same_on_every_path() {
        let gate: Vec<f32> = (0..203).map(|i| (i as f32 - 101.0) * 0.37).chain([-200.0, 200.0, 0.0]).collect();
        let up: Vec<f32> = (0..gate.len()).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let mut out = vec![f32::NAN; gate.len()];
        silu_mul(&mut out, &gate, &up);
        for ((&o, &g), &u) in out.iter().zip(&gate).zip(&up) {
            let want = f64::from(g) / (1.0 + (-f64::from(g)).exp()) * f64::from(u);
            // Below about -88, fast_exp(-g) is clamped at e^88: a tiny nonzero result instead of ~0.
            assert!((f64::from(o) - want).abs() <= 1e-6 * want.abs() + 1e-30, "silu({g}) · {u}: {o} vs {want}");
        }
        let mut portable = vec![f32::NAN; gate.len()];
        gated_lanes(&mut portable, &gate, &up, silu_times);
        assert_eq!(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), portable.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }

    #[test]
    fn gelu_tanh_agrees_with_the_f64_tanh_formula_over_a_wide_range() {
        let gate: Vec<f32> = (0..4001).map(|i| (i as f32 - 2000.0) / 100.0).collect();
        let up: Vec<f32> = (0..gate.len()).map(|i| 1.0 + (i % 7) as f32 / 8.0).collect();
        let mut out = vec![0f32; gate.len()];
        gelu_tanh_mul(&mut out, &gate, &up);
        for ((&o, &g), &u) in out.iter().zip(&gate).zip(&up) {
            let (g, u) = (f64::from(g), f64::from(u));
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044_715 * g * g * g);
            let want = 0.5 * g * (1.0 + inner.tanh()) * u;
            assert!(o.is_finite(), "gelu({g}) = {o}");
            assert!((f64::from(o) - want).abs() <= 1e-6 * want.abs().max(1e-3), "gelu({g})·{u} = {o}, want {want}");
        }
    }

    #[test]
    fn gelu_tanh_vectorized_equals_the_portable_loop_bit_for_bit() {
        let gate: Vec<f32> = (0..1003).map(|i| (i as f32 - 500.0) / 37.0).collect();
        let up: Vec<f32> = (0..gate.len()).map(|i| 0.5 + (i % 5) as f32 / 4.0).collect();
        let (mut fast, mut portable) = (vec![0f32; gate.len()], vec![0f32; gate.len()]);
        gelu_tanh_mul(&mut fast, &gate, &up);
        gated_lanes(&mut portable, &gate, &up, gelu_tanh_times);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fast), bits(&portable));
    }

    #[test]
    fn gelu_tanh_matches_known_values() {
        let gate = [0.0f32, 1.0, -1.0, 3.0];
        let mut out = [0f32; 4];
        gelu_tanh_mul(&mut out, &gate, &[1.0, 1.0, 1.0, 2.0]);
        // torch.nn.functional.gelu(x, approximate="tanh") at 0, 1, -1 and 3 (times 2).
        let want = [0.0, 0.841_192, -0.158_808, 2.0 * 2.996_363];
        for (o, w) in out.iter().zip(want) {
            assert!((o - w).abs() < 1e-5, "{out:?}");
        }
    }

    #[test]
    fn interleaved_and_neox_agree_up_to_permutation() {
        let cfg = |style| ModelConfig {
            family: crate::config::ArchFamily::Llama,
            vocab_size: 1,
            hidden_size: 8,
            intermediate_size: 1,
            num_layers: 1,
            num_heads: 1,
            num_kv_heads: 1,
            head_dim: 8,
            rms_norm_eps: 1e-6,
            rope_theta: 10000.0,
            rope_scaling: None,
            rope_style: style,
            context_length: 16,
            tie_word_embeddings: true,
            sliding_window: None,
            query_pre_attn_scalar: None,
        };
        let neox = Rope::new(&cfg(RopeStyle::Neox));
        let inter = Rope::new(&cfg(RopeStyle::Interleaved));
        let angles = neox.angles(&[5]);
        let x: Vec<f32> = (0..8).map(|i| i as f32 + 1.0).collect();
        // interleaved layout of the same vector: (x0, x4, x1, x5, ...)
        let mut xi: Vec<f32> = (0..4).flat_map(|i| [x[i], x[i + 4]]).collect();
        let mut xn = x.clone();
        neox.apply(&mut xn, &angles, 1);
        inter.apply(&mut xi, &angles, 1);
        for i in 0..4 {
            assert!((xn[i] - xi[2 * i]).abs() < 1e-5 && (xn[i + 4] - xi[2 * i + 1]).abs() < 1e-5);
        }
    }
}
