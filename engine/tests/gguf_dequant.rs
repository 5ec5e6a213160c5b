//! Dequantization against an independent reference: the `gguf` Python
//! package's `gguf.quants.dequantize`, recorded by
//! `tools/reference/make_dequant_fixtures.py` in `fixtures/dequant/`.

use spindle_engine::gguf::types::GgmlType;
use spindle_engine::gguf::{GgufFile, GgufWriter};
use spindle_engine::quant::{dequantize, dequantize_row, dequantize_tensor, dequantize_to_vec};
use spindle_engine::weights::TensorSource;

const FIXTURE: &str = include_str!("fixtures/dequant/dequant_fixtures.json");

struct Case {
    name: String,
    dtype: GgmlType,
    bytes: Vec<u8>,
    values: Vec<f32>,
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

fn cases() -> Vec<Case> {
    let json: serde_json::Value = serde_json::from_str(FIXTURE).expect("fixture is JSON");
    let cases = json["cases"].as_array().expect("cases array");
    cases
        .iter()
        .map(|c| {
            let id = c["type_id"].as_u64().expect("type_id") as u32;
            let values: Vec<f32> = c["values"]
                .as_array()
                .expect("values")
                .iter()
                .map(|v| v.as_f64().expect("number") as f32)
                .collect();
            assert_eq!(
                values.len() as u64,
                c["n_elements"].as_u64().expect("n_elements")
            );
            Case {
                name: c["type"].as_str().expect("type").to_owned(),
                dtype: GgmlType::from_id(id).expect("known type id"),
                bytes: hex(c["bytes_hex"].as_str().expect("hex")),
                values,
            }
        })
        .collect()
}

/// Exact equality (±0 equal), or within 1e-6 relative as a fallback.
fn assert_close(name: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    let mut bad = Vec::new();
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if g != w && (g - w).abs() > 1e-6 * w.abs() {
            bad.push((i, g, w));
        }
    }
    assert!(
        bad.is_empty(),
        "{name}: {} mismatches, first: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
}

#[test]
fn fixture_covers_every_type() {
    let names: Vec<String> = cases().into_iter().map(|c| c.name).collect();
    for t in [
        "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
    ] {
        assert!(names.iter().any(|n| n == t), "fixture lacks {t}");
    }
}

#[test]
fn dequantize_matches_python_reference() {
    for c in cases() {
        let mut out = vec![f32::NAN; c.values.len()];
        dequantize(c.dtype, &c.bytes, &mut out).expect("dequantize");
        // The reference is ggml's scalar code: demand bit-exact results.
        let exact = out
            .iter()
            .zip(&c.values)
            .filter(|(a, b)| a.to_bits() == b.to_bits())
            .count();
        assert_close(&c.name, &out, &c.values);
        assert_eq!(
            exact,
            out.len(),
            "{}: only {exact}/{} bit-exact",
            c.name,
            out.len()
        );
        assert_eq!(
            dequantize_to_vec(c.dtype, &c.bytes).expect("to_vec"),
            out,
            "{}",
            c.name
        );
    }
}

#[test]
fn length_errors_not_panics() {
    for c in cases() {
        let n = c.values.len();
        let mut out = vec![0.0; n];
        assert!(
            dequantize(c.dtype, &c.bytes[..c.bytes.len() - 1], &mut out).is_err(),
            "{}",
            c.name
        );
        let mut longer = c.bytes.clone();
        longer.push(0);
        assert!(
            dequantize(c.dtype, &longer, &mut out).is_err(),
            "{}",
            c.name
        );
        assert!(
            dequantize(c.dtype, &c.bytes, &mut out[..n - 1]).is_err(),
            "{}",
            c.name
        );
        assert!(dequantize(c.dtype, &[], &mut []).is_ok(), "{}", c.name);
    }
}

#[test]
fn through_a_gguf_file_and_by_row() {
    let cases = cases();
    let mut w = GgufWriter::new();
    for c in &cases {
        let bs = c.dtype.block_size().max(8);
        let shape = [c.values.len() / bs, bs];
        w.add_tensor(&c.name, c.dtype, &shape, c.bytes.clone())
            .expect("add");
    }
    let f = GgufFile::from_bytes(w.to_bytes().expect("serialize")).expect("parse");
    for c in &cases {
        let view = f.tensor(&c.name).expect("tensor");
        assert_close(
            &c.name,
            &dequantize_tensor(&view).expect("tensor"),
            &c.values,
        );
        let row_len = view.shape[1];
        let mut row = vec![0.0; row_len];
        for r in 0..view.shape[0] {
            dequantize_row(&view, r, &mut row).expect("row");
            assert_close(&c.name, &row, &c.values[r * row_len..(r + 1) * row_len]);
        }
        assert!(
            dequantize_row(&view, view.shape[0], &mut row).is_err(),
            "row out of range"
        );
        assert!(
            dequantize_row(&view, 0, &mut row[..row_len - 1]).is_err(),
            "short row"
        );
    }
}
