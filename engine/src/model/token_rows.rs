//! Output rows of a quantized layer on the one-token kernels: per token,
//! four weight rows or four tokens at a time, and the K-quant multi-token
//! kernel for small batches (batched decode below the grouped GEMM).

use super::sink::Sink;
use crate::quant::kquant::{KRows4TokensFn, Q8KBlock};

/// One weight format's kernels over token rows of activation blocks `X`
/// (32-value [`crate::quant::dot::Q8Block`]s or K-quant [`Q8KBlock`]s).
pub(super) struct TokenKernels<X> {
    /// One weight row, one token.
    pub(super) one: fn(&[u8], &[X]) -> f32,
    /// One weight row, four tokens `stride` blocks apart.
    pub(super) four: fn(&[u8], &[X], usize) -> [f32; 4],
    /// Four weight rows, one token.
    pub(super) rows4: fn([&[u8]; 4], &[X]) -> [f32; 4],
}

/// Output rows `rows` for `n` tokens of `nb` blocks each: fewer than 4
/// tokens take four weight rows at a time (independent chains), otherwise
/// each weight row takes four tokens at a time; the rest one by one.
#[allow(clippy::too_many_arguments)]
pub(super) fn token_rows<X>(
    k: TokenKernels<X>,
    bytes: &[u8],
    row_bytes: usize,
    rows: std::ops::Range<usize>,
    x: &[X],
    nb: usize,
    n: usize,
    write: &Sink,
) {
    let row = |r: usize| &bytes[r * row_bytes..(r + 1) * row_bytes];
    let mut r = rows.start;
    if n < 4 {
        while r + 4 <= rows.end {
            for t in 0..n {
                let out = (k.rows4)([row(r), row(r + 1), row(r + 2), row(r + 3)], &x[t * nb..(t + 1) * nb]);
                for (i, v) in out.into_iter().enumerate() {
                    write.put(r + i, t, v);
                }
            }
            r += 4;
        }
    }
    for r in r..rows.end {
        let wr = row(r);
        let mut t = 0;
        while t + 4 <= n {
            for (j, v) in (k.four)(wr, &x[t * nb..(t + 4) * nb], nb).into_iter().enumerate() {
                write.put(r, t + j, v);
            }
            t += 4;
        }
        for t in t..n {
            write.put(r, t, (k.one)(wr, &x[t * nb..(t + 1) * nb]));
        }
    }
}

/// Output rows of `rows`, four at a time, for all `n` tokens with a kernel
/// that unpacks each row once for up to [`KROWS_TOKENS`] tokens (batched
/// decode); returns the rows left (fewer than four).
#[allow(clippy::too_many_arguments)]
pub(super) fn rows4_tokens(
    many: KRows4TokensFn,
    bytes: &[u8],
    row_bytes: usize,
    rows: std::ops::Range<usize>,
    x: &[Q8KBlock],
    nb: usize,
    n: usize,
    write: &Sink,
) -> std::ops::Range<usize> {
    let row = |r: usize| &bytes[r * row_bytes..(r + 1) * row_bytes];
    let mut out = [[0f32; 4]; KROWS_TOKENS];
    let mut r = rows.start;
    while r + 4 <= rows.end {
        for first in (0..n).step_by(KROWS_TOKENS) {
            let count = (n - first).min(KROWS_TOKENS);
            many([row(r), row(r + 1), row(r + 2), row(r + 3)], &x[first * nb..(first + count) * nb], nb, &mut out[..count]);
            for (t, lanes) in out[..count].iter().enumerate() {
                for (i, v) in lanes.iter().enumerate() {
                    write.put(r + i, first + t, *v);
                }
            }
        }
        r += 4;
    }
    r..rows.end
}

/// Tokens per call of a [`KRows4TokensFn`].
const KROWS_TOKENS: usize = 8;
