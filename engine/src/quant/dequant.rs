//! Dequantization of GGML block formats to `f32`.
//!
//! Each block decoder follows ggml's reference `dequantize_row_*` in
//! `ggml-quants.c` operation for operation (same products in the same order,
//! no fused multiply-add), so results are bit-exact with ggml's scalar path
//! and with the `gguf` Python package's `gguf.quants.dequantize`.

use crate::error::{EngineError, Result};
use crate::gguf::types::GgmlType;
use crate::weights::TensorView;

/// Elements per k-quant super-block.
pub const QK_K: usize = 256;

/// Blocks above which dequantization is split across the engine's pool.
const PARALLEL_MIN_BLOCKS: usize = 4096;

/// Blocks handed to one task of the pool.
const BLOCKS_PER_TASK: usize = 1024;

/// Dequantize `out.len()` elements of type `dtype` from `data`.
///
/// `out.len()` must be a whole number of `dtype` blocks and `data.len()`
/// exactly the bytes those blocks occupy; anything else is an error.
/// `Q8_1` (an activation-only type) is [`EngineError::UnsupportedDtype`].
pub fn dequantize(dtype: GgmlType, data: &[u8], out: &mut [f32]) -> Result<()> {
    let expected = dtype.bytes_for(out.len())?;
    if data.len() != expected {
        return Err(EngineError::InvalidGguf(format!(
            "dequantize {dtype:?}: {} bytes given for {} elements, expected {expected}",
            data.len(),
            out.len()
        )));
    }
    match dtype {
        GgmlType::F32 => run_blocks::<4, 1>(data, out, block_f32),
        GgmlType::F16 => run_blocks::<2, 1>(data, out, block_f16),
        GgmlType::BF16 => run_blocks::<2, 1>(data, out, block_bf16),
        GgmlType::Q4_0 => run_blocks::<18, 32>(data, out, block_q4_0),
        GgmlType::Q4_1 => run_blocks::<20, 32>(data, out, block_q4_1),
        GgmlType::Q5_0 => run_blocks::<22, 32>(data, out, block_q5_0),
        GgmlType::Q5_1 => run_blocks::<24, 32>(data, out, block_q5_1),
        GgmlType::Q8_0 => run_blocks::<34, 32>(data, out, block_q8_0),
        GgmlType::Q4K => run_blocks::<144, QK_K>(data, out, block_q4_k),
        GgmlType::Q5K => run_blocks::<176, QK_K>(data, out, block_q5_k),
        GgmlType::Q6K => run_blocks::<210, QK_K>(data, out, block_q6_k),
        GgmlType::Q8_1 => Err(EngineError::UnsupportedDtype(
            "Q8_1 is an activation-only type and cannot be dequantized".to_owned(),
        )),
    }
}

/// Dequantize a whole byte buffer of type `dtype`; the element count is
/// inferred from `data.len()`, which must be a whole number of blocks.
pub fn dequantize_to_vec(dtype: GgmlType, data: &[u8]) -> Result<Vec<f32>> {
    let (ts, bs) = (dtype.type_size(), dtype.block_size());
    if !data.len().is_multiple_of(ts) {
        return Err(EngineError::InvalidGguf(format!(
            "dequantize {dtype:?}: {} bytes is not a whole number of {ts}-byte blocks",
            data.len()
        )));
    }
    let n = (data.len() / ts).checked_mul(bs).ok_or_else(|| {
        EngineError::InvalidGguf("dequantize: element count overflows".to_owned())
    })?;
    let mut out = vec![0.0f32; n];
    dequantize(dtype, data, &mut out)?;
    Ok(out)
}

/// Dequantize a whole tensor into a new vector (row-major, outermost first).
pub fn dequantize_tensor(view: &TensorView<'_>) -> Result<Vec<f32>> {
    let n = view
        .shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| {
            EngineError::InvalidGguf(format!("tensor `{}` element count overflows", view.name))
        })?;
    let mut out = vec![0.0f32; n];
    dequantize(view.dtype, view.data, &mut out)
        .map_err(|e| EngineError::InvalidGguf(format!("tensor `{}`: {e}", view.name)))?;
    Ok(out)
}

/// Dequantize row `row` of a tensor (a row is the innermost dimension, e.g.
/// one token's embedding in `token_embd.weight`) into `out`, whose length
/// must equal the row length.
pub fn dequantize_row(view: &TensorView<'_>, row: usize, out: &mut [f32]) -> Result<()> {
    let row_len = view.shape.last().copied().unwrap_or(1);
    let n_rows = view.shape.iter().rev().skip(1).product::<usize>();
    if row >= n_rows {
        return Err(EngineError::InvalidGguf(format!(
            "row {row} out of range for tensor `{}` with {n_rows} rows",
            view.name
        )));
    }
    if out.len() != row_len {
        return Err(EngineError::InvalidGguf(format!(
            "row output has {} elements, tensor `{}` rows have {row_len}",
            out.len(),
            view.name
        )));
    }
    let row_bytes = view.dtype.bytes_for(row_len)?;
    let start = row.checked_mul(row_bytes);
    let bytes = start
        .and_then(|s| s.checked_add(row_bytes).map(|e| s..e))
        .and_then(|r| view.data.get(r))
        .ok_or_else(|| {
            EngineError::InvalidGguf(format!(
                "tensor `{}` data is shorter than its shape",
                view.name
            ))
        })?;
    dequantize(view.dtype, bytes, out)
}

/// Decode `data` (whole blocks of `IN` bytes) into `out` (blocks of `OUT`
/// values) with `f`, in parallel for large inputs. Lengths are pre-checked.
fn run_blocks<const IN: usize, const OUT: usize>(
    data: &[u8],
    out: &mut [f32],
    f: fn(&[u8; IN], &mut [f32; OUT]),
) -> Result<()> {
    if data.len() / IN >= PARALLEL_MIN_BLOCKS {
        let mut parts: Vec<(&[u8], &mut [f32], Result<()>)> =
            data.chunks(IN * BLOCKS_PER_TASK).zip(out.chunks_mut(OUT * BLOCKS_PER_TASK)).map(|(d, o)| (d, o, Ok(()))).collect();
        crate::pool::for_each_mut(&mut parts, |_, (d, o, result)| *result = run_serial(d, o, f));
        parts.into_iter().try_for_each(|(_, _, result)| result)
    } else {
        run_serial(data, out, f)
    }
}

fn run_serial<const IN: usize, const OUT: usize>(
    data: &[u8],
    out: &mut [f32],
    f: fn(&[u8; IN], &mut [f32; OUT]),
) -> Result<()> {
    if data.len() / IN != out.len() / OUT
        || !data.len().is_multiple_of(IN)
        || !out.len().is_multiple_of(OUT)
    {
        return Err(EngineError::InvalidGguf(
            "dequantize: block count mismatch".to_owned(),
        ));
    }
    for (d, o) in data.chunks_exact(IN).zip(out.chunks_exact_mut(OUT)) {
        match (<&[u8; IN]>::try_from(d), <&mut [f32; OUT]>::try_from(o)) {
            (Ok(d), Ok(o)) => f(d, o),
            _ => return Err(EngineError::InvalidGguf("dequantize: bad block".to_owned())),
        }
    }
    Ok(())
}

/// An IEEE half at `b[i..i + 2]` (little-endian) as `f32` (exact).
#[inline(always)]
fn f16_at(lo: u8, hi: u8) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([lo, hi])).to_f32()
}

fn block_f32(b: &[u8; 4], y: &mut [f32; 1]) {
    y[0] = f32::from_le_bytes(*b);
}

fn block_f16(b: &[u8; 2], y: &mut [f32; 1]) {
    y[0] = f16_at(b[0], b[1]);
}

fn block_bf16(b: &[u8; 2], y: &mut [f32; 1]) {
    y[0] = f32::from_bits(u32::from(u16::from_le_bytes(*b)) << 16);
}

/// `block_q4_0`: f16 d, then 16 bytes of nibbles (low nibbles are elements
/// 0..16, high nibbles 16..32); `y = (q - 8) * d`.
fn block_q4_0(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_at(b[0], b[1]);
    for j in 0..16 {
        let q = b[2 + j];
        y[j] = (i32::from(q & 0x0F) - 8) as f32 * d;
        y[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
    }
}

/// `block_q4_1`: f16 d, f16 m, 16 bytes of nibbles; `y = q * d + m`.
fn block_q4_1(b: &[u8; 20], y: &mut [f32; 32]) {
    let d = f16_at(b[0], b[1]);
    let m = f16_at(b[2], b[3]);
    for j in 0..16 {
        let q = b[4 + j];
        y[j] = f32::from(q & 0x0F) * d + m;
        y[j + 16] = f32::from(q >> 4) * d + m;
    }
}

/// `block_q8_0`: f16 d, 32 signed bytes; `y = q * d`.
fn block_q8_0(b: &[u8; 34], y: &mut [f32; 32]) {
    let d = f16_at(b[0], b[1]);
    for j in 0..32 {
        y[j] = f32::from(b[2 + j] as i8) * d;
    }
}

/// The 32 five-bit values of a Q5_0/Q5_1 block: low nibbles of `qs` for
/// elements 0..16 and high nibbles for 16..32, the fifth bit of element `j`
/// in bit `j` of the little-endian `qh`.
#[inline(always)]
fn q5_values(qh: [u8; 4], qs: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes(qh);
    let mut u = [0u8; 32];
    for j in 0..16 {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        u[j] = (qs[j] & 0x0F) | h0;
        u[j + 16] = (qs[j] >> 4) | h1;
    }
    u
}

/// `block_q5_0`: f16 d, 4 bytes of high bits, 16 nibble bytes; `y = d·(q − 16)`.
fn block_q5_0(b: &[u8; 22], y: &mut [f32; 32]) {
    let d = f16_at(b[0], b[1]);
    let u = q5_values([b[2], b[3], b[4], b[5]], &b[6..22]);
    for j in 0..32 {
        y[j] = f32::from(u[j] as i8 - 16) * d;
    }
}

/// `block_q5_1`: f16 d, f16 m, 4 bytes of high bits, 16 nibble bytes; `y = d·q + m`.
fn block_q5_1(b: &[u8; 24], y: &mut [f32; 32]) {
    let (d, m) = (f16_at(b[0], b[1]), f16_at(b[2], b[3]));
    let u = q5_values([b[4], b[5], b[6], b[7]], &b[8..24]);
    for j in 0..32 {
        y[j] = f32::from(u[j]) * d + m;
    }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j`
/// (0..8) from the 12 packed scale bytes of a Q4_K / Q5_K block.
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The 12 scale bytes at `b[4..16]` of a Q4_K / Q5_K block.
#[inline(always)]
fn k4_scales(b: &[u8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    if let Some(src) = b.get(4..16) {
        s.copy_from_slice(src);
    }
    s
}

/// `block_q4_K`: f16 d, f16 dmin, 12 scale bytes, 128 nibble bytes. Each
/// 64-element chunk uses 32 bytes: low nibbles with sub-block scale/min
/// `2i`, high nibbles with `2i + 1`; `y = d*sc * q - dmin*m`.
fn block_q4_k(b: &[u8; 144], y: &mut [f32; 256]) {
    let d = f16_at(b[0], b[1]);
    let min = f16_at(b[2], b[3]);
    let scales = k4_scales(b);
    for c in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * c, &scales);
        let (sc2, m2) = scale_min_k4(2 * c + 1, &scales);
        let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
        let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
        for l in 0..32 {
            let q = b[16 + 32 * c + l];
            y[64 * c + l] = d1 * f32::from(q & 0x0F) - m1;
            y[64 * c + 32 + l] = d2 * f32::from(q >> 4) - m2;
        }
    }
}

/// `block_q5_K`: f16 d, f16 dmin, 12 scale bytes, 32 high-bit bytes, 128
/// nibble bytes. Like Q4_K, plus a fifth bit from `qh` (bit `2i` for the low
/// nibbles of chunk `i`, bit `2i + 1` for the high ones) worth 16.
fn block_q5_k(b: &[u8; 176], y: &mut [f32; 256]) {
    let d = f16_at(b[0], b[1]);
    let min = f16_at(b[2], b[3]);
    let scales = k4_scales(b);
    for c in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * c, &scales);
        let (sc2, m2) = scale_min_k4(2 * c + 1, &scales);
        let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
        let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
        let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
        for l in 0..32 {
            let ql = b[48 + 32 * c + l];
            let qh = b[16 + l];
            let h1 = if qh & u1 != 0 { 16 } else { 0 };
            let h2 = if qh & u2 != 0 { 16 } else { 0 };
            y[64 * c + l] = d1 * f32::from((ql & 0x0F) + h1) - m1;
            y[64 * c + 32 + l] = d2 * f32::from((ql >> 4) + h2) - m2;
        }
    }
}

/// `block_q6_K`: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16
/// signed 8-bit scales (one per 16 elements), f16 d; `y = d*sc * (q - 32)`.
fn block_q6_k(b: &[u8; 210], y: &mut [f32; 256]) {
    let d = f16_at(b[208], b[209]);
    for n in 0..2 {
        let (ql, qh, sc, yo) = (64 * n, 128 + 32 * n, 192 + 8 * n, 128 * n);
        for l in 0..32 {
            let is = l / 16;
            let (lo, hi, h) = (b[ql + l], b[ql + l + 32], b[qh + l]);
            let q1 = i32::from((lo & 0x0F) | ((h & 3) << 4)) - 32;
            let q2 = i32::from((hi & 0x0F) | (((h >> 2) & 3) << 4)) - 32;
            let q3 = i32::from((lo >> 4) | (((h >> 4) & 3) << 4)) - 32;
            let q4 = i32::from((hi >> 4) | (((h >> 6) & 3) << 4)) - 32;
            let s = |k: usize| f32::from(b[sc + is + k] as i8);
            y[yo + l] = d * s(0) * q1 as f32;
            y[yo + l + 32] = d * s(2) * q2 as f32;
            y[yo + l + 64] = d * s(4) * q3 as f32;
            y[yo + l + 96] = d * s(6) * q4 as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_mismatch_is_an_error() {
        let mut out = [0.0f32; 32];
        assert!(dequantize(GgmlType::Q4_0, &[0u8; 17], &mut out).is_err());
        assert!(dequantize(GgmlType::Q4_0, &[0u8; 19], &mut out).is_err());
        let mut out = [0.0f32; 31];
        assert!(dequantize(GgmlType::Q4_0, &[0u8; 18], &mut out).is_err());
        assert!(dequantize(GgmlType::Q8_1, &[0u8; 40], &mut [0.0; 32]).is_err());
        assert!(dequantize_to_vec(GgmlType::Q6K, &[0u8; 211]).is_err());
    }

    #[test]
    fn q4_0_simple_block() {
        let mut b = [0u8; 18];
        b[..2].copy_from_slice(&half::f16::from_f32(0.5).to_bits().to_le_bytes());
        b[2] = 0xF0; // element 0 -> q=0, element 16 -> q=15
        let v = dequantize_to_vec(GgmlType::Q4_0, &b).unwrap_or_default();
        assert_eq!(v.len(), 32);
        assert_eq!(v[0], -4.0);
        assert_eq!(v[16], 3.5);
        assert_eq!(v[1], -4.0);
    }

    #[test]
    fn parallel_path_matches_serial() {
        let n_blocks = PARALLEL_MIN_BLOCKS + 37;
        let mut data = vec![0u8; n_blocks * 34];
        for (i, blk) in data.chunks_exact_mut(34).enumerate() {
            blk[..2].copy_from_slice(
                &half::f16::from_f32(0.01 * (i % 7) as f32)
                    .to_bits()
                    .to_le_bytes(),
            );
            for (j, q) in blk[2..].iter_mut().enumerate() {
                *q = (i * 31 + j * 7) as u8;
            }
        }
        let par = dequantize_to_vec(GgmlType::Q8_0, &data).unwrap_or_default();
        let mut ser = vec![0.0f32; n_blocks * 32];
        assert!(run_serial::<34, 32>(&data, &mut ser, block_q8_0).is_ok());
        assert_eq!(par, ser);
    }
}
