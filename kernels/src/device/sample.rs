//! Launch of the sampling kernel (`cuda/sample.cu`): one token per row of
//! logits chosen on the device, so only 8 bytes per sequence come back.

use super::{int, need, CudaError, Gpu};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

const SAMPLE_THREADS: u32 = 1024;

/// How one row of logits is sampled (the host sampler's parameters).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowSampling {
    /// The row of the logits matrix.
    pub row: usize,
    /// Temperature; below 1e-5 is greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely (0 = off; 1 = greedy).
    pub top_k: usize,
    /// Nucleus mass in (0, 1] (1 = off).
    pub top_p: f32,
    /// Drop tokens under `min_p` × the most likely one's probability (0 = off).
    pub min_p: f32,
    /// The uniform draw in [0, 1) from the sequence's seeded generator.
    pub uniform: f64,
}

/// The token a row sampled, with its logprob (log-softmax at temperature 1,
/// before truncation, as the host sampler reports it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowSample {
    /// The chosen token id.
    pub token: u32,
    /// Its logprob.
    pub logprob: f32,
}

impl Gpu {
    /// Samples one token from each listed row of `logits` (`[rows, vocab]`,
    /// f32). Rows sampled with a temperature are overwritten with their
    /// probabilities; greedy rows are left as they were. Rows must be distinct.
    pub fn sample_rows(&self, logits: &mut CudaSlice<f32>, vocab: usize, rows: &[RowSampling]) -> Result<Vec<RowSample>, CudaError> {
        let f = self.function("sample_rows_f32")?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        if vocab == 0 {
            return Err(CudaError::Shape("sampling needs a vocabulary".into()));
        }
        let max_row = rows.iter().map(|r| r.row).max().unwrap_or(0);
        need(logits, (max_row + 1) * vocab, "logits")?;
        let mut seen: Vec<usize> = rows.iter().map(|r| r.row).collect();
        seen.sort_unstable();
        if seen.windows(2).any(|w| w[0] == w[1]) {
            return Err(CudaError::Shape("a row is listed twice".into()));
        }
        let s = &self.stream;
        let row_ids = rows.iter().map(|r| int(r.row)).collect::<Result<Vec<i32>, _>>()?;
        let top_k = rows.iter().map(|r| int(r.top_k.min(vocab))).collect::<Result<Vec<i32>, _>>()?;
        let temperature: Vec<f32> = rows.iter().map(|r| r.temperature).collect();
        let top_p: Vec<f32> = rows.iter().map(|r| r.top_p).collect();
        let min_p: Vec<f32> = rows.iter().map(|r| r.min_p).collect();
        // In [0, 1) after rounding to f32 too.
        let uniform: Vec<f32> = rows.iter().map(|r| (r.uniform.clamp(0.0, 1.0) as f32).min(1.0 - f32::EPSILON / 2.0)).collect();
        let (d_rows, d_t, d_k) = (s.clone_htod(&row_ids)?, s.clone_htod(&temperature)?, s.clone_htod(&top_k)?);
        let (d_p, d_min, d_u) = (s.clone_htod(&top_p)?, s.clone_htod(&min_p)?, s.clone_htod(&uniform)?);
        let mut tokens = s.alloc_zeros::<i32>(rows.len())?;
        let mut logprobs = s.alloc_zeros::<f32>(rows.len())?;
        let vocab32 = int(vocab)?;
        let cfg = LaunchConfig { grid_dim: (int(rows.len())? as u32, 1, 1), block_dim: (SAMPLE_THREADS, 1, 1), shared_mem_bytes: 0 };
        let mut launch = s.launch_builder(f);
        launch.arg(&mut tokens).arg(&mut logprobs).arg(logits).arg(&d_rows).arg(&d_t).arg(&d_k).arg(&d_p).arg(&d_min).arg(&d_u).arg(&vocab32);
        // SAFETY: the argument list matches the kernel; every row is distinct
        // and inside `logits` (checked above); the parameter arrays hold one
        // value per row.
        unsafe { launch.launch(cfg) }?;
        let (tokens, logprobs) = (s.clone_dtoh(&tokens)?, s.clone_dtoh(&logprobs)?);
        Ok(tokens.into_iter().zip(logprobs).map(|(t, logprob)| RowSample { token: t.max(0) as u32, logprob }).collect())
    }
}
