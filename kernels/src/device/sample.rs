//! Launch of the sampling kernel (`cuda/sample.cu`): one token per row of
//! logits chosen on the device (grammar mask and penalties applied there
//! too), so only 8 bytes per sequence come back.

use super::{int, need, CudaError, Gpu};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

const SAMPLE_THREADS: u32 = 1024;

/// How one row of logits is sampled (the host sampler's parameters).
#[derive(Debug, Clone, PartialEq)]
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
    /// Repetition penalty over every token in `seen` (1 = off).
    pub repetition_penalty: f32,
    /// Subtracted once from every token seen in the output.
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the output.
    pub frequency_penalty: f32,
    /// Distinct tokens of prompt and output in increasing order, each with
    /// its count in the output (0: prompt only); empty without penalties.
    pub seen: Vec<(u32, u32)>,
    /// The grammar's allowed ids, bit `t % 32` of word `t / 32`; `None` without a grammar.
    pub mask: Option<Vec<u32>>,
}

impl RowSampling {
    /// Greedy or plain sampling of `row` with no penalties or mask.
    pub fn plain(row: usize, temperature: f32, top_k: usize, top_p: f32, min_p: f32, uniform: f64) -> Self {
        Self { row, temperature, top_k, top_p, min_p, uniform, repetition_penalty: 1.0, presence_penalty: 0.0, frequency_penalty: 0.0, seen: Vec::new(), mask: None }
    }
}

/// The token a row sampled, with its logprob (log-softmax at temperature 1
/// of the masked, penalised logits, before truncation, as the host sampler
/// reports it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowSample {
    /// The chosen token id.
    pub token: u32,
    /// Its logprob.
    pub logprob: f32,
}

/// `values`, or one default value where there are none (no empty buffers).
fn nonempty<T: Clone + Default>(mut values: Vec<T>) -> Vec<T> {
    if values.is_empty() {
        values.push(T::default());
    }
    values
}

impl Gpu {
    /// Samples one token from each listed row of `logits` (`[rows, vocab]`,
    /// f32). Every sampled row is overwritten (masked, penalised; with a
    /// temperature, its probabilities). Rows must be distinct.
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
        let words = vocab.div_ceil(32);
        if let Some(bad) = rows.iter().filter_map(|r| r.mask.as_ref()).find(|m| m.len() != words) {
            return Err(CudaError::Shape(format!("a grammar mask of {} words for a vocabulary of {vocab} ({words} words)", bad.len())));
        }
        if rows.iter().any(|r| r.seen.windows(2).any(|w| w[0].0 >= w[1].0)) {
            return Err(CudaError::Shape("penalty tokens must be distinct and in increasing order".into()));
        }
        let row_ids = rows.iter().map(|r| int(r.row)).collect::<Result<Vec<i32>, _>>()?;
        let top_k = rows.iter().map(|r| int(r.top_k.min(vocab))).collect::<Result<Vec<i32>, _>>()?;
        let floats = |get: fn(&RowSampling) -> f32| -> Vec<f32> { rows.iter().map(get).collect() };
        // In [0, 1) after rounding to f32 too.
        let uniform: Vec<f32> = rows.iter().map(|r| (r.uniform.clamp(0.0, 1.0) as f32).min(1.0 - f32::EPSILON / 2.0)).collect();
        let mut pen_start = vec![0i32];
        let (mut pen_token, mut pen_count) = (Vec::new(), Vec::new());
        for r in rows {
            for &(t, c) in &r.seen {
                pen_token.push(i32::try_from(t).unwrap_or(-1));
                pen_count.push(c as f32);
            }
            pen_start.push(int(pen_token.len())?);
        }
        let (mut masks, mut mask_row) = (Vec::new(), Vec::with_capacity(rows.len()));
        for r in rows {
            match &r.mask {
                Some(m) => {
                    mask_row.push(int(masks.len() / words)?);
                    masks.extend_from_slice(m);
                }
                None => mask_row.push(-1),
            }
        }
        let s = &self.stream;
        let up = |v: Vec<f32>| s.clone_htod(&v);
        let (d_rows, d_k, d_u) = (s.clone_htod(&row_ids)?, s.clone_htod(&top_k)?, s.clone_htod(&uniform)?);
        let (d_t, d_p, d_min) = (up(floats(|r| r.temperature))?, up(floats(|r| r.top_p))?, up(floats(|r| r.min_p))?);
        let (d_rep, d_pres, d_freq) = (up(floats(|r| r.repetition_penalty))?, up(floats(|r| r.presence_penalty))?, up(floats(|r| r.frequency_penalty))?);
        let d_pen_start = s.clone_htod(&pen_start)?;
        let (d_pen_token, d_pen_count) = (s.clone_htod(&nonempty(pen_token))?, s.clone_htod(&nonempty(pen_count))?);
        let (d_masks, d_mask_row) = (s.clone_htod(&nonempty(masks))?, s.clone_htod(&mask_row)?);
        let mut tokens = s.alloc_zeros::<i32>(rows.len())?;
        let mut logprobs = s.alloc_zeros::<f32>(rows.len())?;
        let (vocab32, words32) = (int(vocab)?, int(words)?);
        let cfg = LaunchConfig { grid_dim: (int(rows.len())? as u32, 1, 1), block_dim: (SAMPLE_THREADS, 1, 1), shared_mem_bytes: 0 };
        let mut launch = s.launch_builder(f);
        launch.arg(&mut tokens).arg(&mut logprobs).arg(logits).arg(&d_rows).arg(&d_t).arg(&d_k).arg(&d_p).arg(&d_min).arg(&d_u).arg(&vocab32);
        launch.arg(&d_rep).arg(&d_pres).arg(&d_freq).arg(&d_pen_start).arg(&d_pen_token).arg(&d_pen_count);
        launch.arg(&d_masks).arg(&d_mask_row).arg(&words32);
        // SAFETY: the argument list matches the kernel; every row is distinct
        // and inside `logits` (checked above); the per-row arrays hold one
        // value per row, pen_start rows + 1 offsets into the entries, and
        // every mask row `words` words.
        unsafe { launch.launch(cfg) }?;
        let (tokens, logprobs) = (s.clone_dtoh(&tokens)?, s.clone_dtoh(&logprobs)?);
        Ok(tokens.into_iter().zip(logprobs).map(|(t, logprob)| RowSample { token: t.max(0) as u32, logprob }).collect())
    }
}
