//! Malformed GGUF input: every case must be a typed error, never a panic.

use spindle_engine::gguf::types::GgmlType;
use spindle_engine::gguf::{GgufFile, GgufWriter, MetadataValue as V};
use spindle_engine::weights::TensorSource;
use spindle_engine::EngineError;

/// Hand-assembles GGUF bytes, so tests can write things the writer refuses to.
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&version.to_le_bytes());
        b.extend_from_slice(&n_tensors.to_le_bytes());
        b.extend_from_slice(&n_kv.to_le_bytes());
        Self(b)
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(self, s: &str) -> Self {
        let mut r = self.u64(s.len() as u64);
        r.0.extend_from_slice(s.as_bytes());
        r
    }
    fn tensor(self, name: &str, ne: &[u64], type_id: u32, offset: u64) -> Self {
        let mut r = self.str(name).u32(ne.len() as u32);
        for &d in ne {
            r = r.u64(d);
        }
        r.u32(type_id).u64(offset)
    }
    fn pad_to(mut self, len: usize) -> Self {
        self.0.resize(len, 0);
        self
    }
    fn parse(self) -> Result<GgufFile, EngineError> {
        GgufFile::from_bytes(self.0)
    }
}

fn sample() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", V::String("llama".into()));
    w.add_metadata("a.u32", V::U32(7));
    w.add_metadata(
        "a.arr",
        V::Array(vec![V::String("x".into()), V::String("yz".into())]),
    );
    w.add_metadata("a.nested", V::Array(vec![V::Array(vec![V::I16(1)])]));
    w.add_metadata("a.f64", V::F64(0.5));
    w.add_tensor("t0", GgmlType::F32, &[3], vec![1; 12])
        .expect("t0");
    w.add_tensor("t1", GgmlType::Q8_0, &[2, 32], vec![2; 68])
        .expect("t1");
    w.to_bytes().expect("serialize")
}

fn invalid_msg(r: Result<GgufFile, EngineError>) -> String {
    match r {
        Err(EngineError::InvalidGguf(m)) => m,
        other => panic!("expected InvalidGguf, got {other:?}"),
    }
}

#[test]
fn every_truncation_is_an_error_never_a_panic() {
    let bytes = sample();
    let full = GgufFile::from_bytes(bytes.clone()).expect("full file parses");
    let data_end = full
        .tensor_infos()
        .iter()
        .map(|t| t.offset as usize + t.size)
        .max()
        .expect("tensors");
    for len in 0..=bytes.len() {
        let r = GgufFile::from_bytes(bytes[..len].to_vec());
        if len < data_end {
            assert!(
                matches!(r, Err(EngineError::InvalidGguf(_))),
                "prefix {len}: {r:?}"
            );
        } else {
            // Only trailing padding is missing: still a valid file.
            assert!(r.is_ok(), "prefix {len}: {r:?}");
        }
    }
}

#[test]
fn corrupted_bytes_never_panic() {
    let bytes = sample();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..3000 {
        let mut b = bytes.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() % b.len() as u64) as usize;
            b[i] = next() as u8;
        }
        // Any outcome but a panic is fine; tensors that parse must be in bounds.
        if let Ok(f) = GgufFile::from_bytes(b) {
            for t in f.tensor_infos() {
                assert_eq!(f.tensor(&t.name).map(|v| v.data.len()).ok(), Some(t.size));
            }
        }
    }
}

#[test]
fn bad_magic() {
    let mut b = sample();
    b[..4].copy_from_slice(b"GGML");
    assert!(invalid_msg(GgufFile::from_bytes(b)).contains("magic"));
    assert!(invalid_msg(GgufFile::from_bytes(b"PK\x03\x04 zip file".to_vec())).contains("magic"));
}

#[test]
fn version_1_and_unknown_versions_are_rejected() {
    let m = invalid_msg(Raw::header(1, 0, 0).parse());
    assert!(m.contains("version 1"), "{m}");
    let m = invalid_msg(Raw::header(4, 0, 0).parse());
    assert!(m.contains("version 4"), "{m}");
    let mut b = Raw::header(3, 0, 0).0;
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(invalid_msg(GgufFile::from_bytes(b)).contains("big-endian"));
}

#[test]
fn string_length_past_eof() {
    // Key length past EOF.
    let m = invalid_msg(Raw::header(3, 0, 1).u64(1000).pad_to(64).parse());
    assert!(m.contains("length 1000"), "{m}");
    // String value length past EOF (and an absurd one).
    for len in [100u64, u64::MAX] {
        let r = Raw::header(3, 0, 1).str("k").u32(8).u64(len).pad_to(60);
        assert!(invalid_msg(r.parse()).contains("past the end"));
    }
    // Tensor name length past EOF.
    let r = Raw::header(3, 1, 0).u64(1 << 40).pad_to(100);
    assert!(invalid_msg(r.parse()).contains("past the end"));
}

#[test]
fn tensor_data_past_end_of_file() {
    let hdr = Raw::header(3, 1, 0).tensor("w", &[8], 0, 0);
    let start = hdr.0.len().div_ceil(32) * 32;
    // 8 f32 = 32 bytes, but only 31 present.
    let m = invalid_msg(Raw(hdr.0.clone()).pad_to(start + 31).parse());
    assert!(m.contains("past the end"), "{m}");
    assert!(Raw(hdr.0).pad_to(start + 32).parse().is_ok());
    // Offset far past the end, and one that overflows.
    for off in [1u64 << 32, u64::MAX - 31] {
        let r = Raw::header(3, 1, 0).tensor("w", &[8], 0, off).pad_to(512);
        assert!(matches!(r.parse(), Err(EngineError::InvalidGguf(_))));
    }
    // Misaligned offset.
    let m = invalid_msg(
        Raw::header(3, 1, 0)
            .tensor("w", &[8], 0, 4)
            .pad_to(512)
            .parse(),
    );
    assert!(m.contains("alignment"), "{m}");
}

#[test]
fn unknown_tensor_type_id() {
    let r = Raw::header(3, 1, 0).tensor("w", &[32], 10, 0).pad_to(512);
    match r.parse() {
        Err(EngineError::UnsupportedDtype(m)) => {
            assert!(m.contains("10") && m.contains("`w`") && m.contains("supported: "), "{m}")
        }
        other => panic!("expected UnsupportedDtype, got {other:?}"),
    }
    let r = Raw::header(3, 1, 0)
        .tensor("w", &[32], u32::MAX, 0)
        .pad_to(512);
    assert!(matches!(r.parse(), Err(EngineError::UnsupportedDtype(_))));
}

#[test]
fn absurd_counts() {
    // Array of u8 claiming 2^40 items.
    let r = Raw::header(3, 0, 1)
        .str("k")
        .u32(9)
        .u32(0)
        .u64(1 << 40)
        .pad_to(200);
    assert!(invalid_msg(r.parse()).contains("array length"));
    // Array of strings claiming u64::MAX items.
    let r = Raw::header(3, 0, 1)
        .str("k")
        .u32(9)
        .u32(8)
        .u64(u64::MAX)
        .pad_to(200);
    assert!(matches!(r.parse(), Err(EngineError::InvalidGguf(_))));
    // Tensor and key/value counts.
    let r = Raw::header(3, u64::MAX, 0).pad_to(200);
    assert!(invalid_msg(r.parse()).contains("tensor count"));
    let r = Raw::header(3, 0, 1 << 50).pad_to(200);
    assert!(invalid_msg(r.parse()).contains("key/value count"));
    // Unknown metadata value type and array item type.
    let r = Raw::header(3, 0, 1).str("k").u32(13).pad_to(64);
    assert!(invalid_msg(r.parse()).contains("type id 13"));
    let r = Raw::header(3, 0, 1)
        .str("k")
        .u32(9)
        .u32(99)
        .u64(1)
        .pad_to(64);
    assert!(invalid_msg(r.parse()).contains("type id 99"));
}

#[test]
fn bad_dimensions() {
    // Element count overflow.
    let r = Raw::header(3, 1, 0)
        .tensor("w", &[1 << 62, 1 << 62], 0, 0)
        .pad_to(256);
    assert!(invalid_msg(r.parse()).contains("overflow"));
    // Huge but not overflowing count: the size check catches it.
    let r = Raw::header(3, 1, 0)
        .tensor("w", &[1 << 20, 1 << 20], 0, 0)
        .pad_to(256);
    assert!(invalid_msg(r.parse()).contains("past the end"));
    // Too many dimensions.
    let r = Raw::header(3, 1, 0)
        .tensor("w", &[1, 1, 1, 1, 1], 0, 0)
        .pad_to(256);
    assert!(invalid_msg(r.parse()).contains("dimensions"));
    // Row not a whole number of blocks.
    let r = Raw::header(3, 1, 0).tensor("w", &[16, 2], 2, 0).pad_to(256);
    assert!(invalid_msg(r.parse()).contains("block size"));
}

#[test]
fn bad_alignment_and_duplicates() {
    for align in [0u32, 3, 48] {
        let r = Raw::header(3, 0, 1)
            .str("general.alignment")
            .u32(4)
            .u32(align);
        assert!(invalid_msg(r.parse()).contains("alignment"), "{align}");
    }
    let r = Raw::header(3, 0, 2)
        .str("k")
        .u32(4)
        .u32(1)
        .str("k")
        .u32(4)
        .u32(2);
    assert!(invalid_msg(r.parse()).contains("duplicate"));
    let r = Raw::header(3, 2, 0)
        .tensor("w", &[8], 0, 0)
        .tensor("w", &[8], 0, 32)
        .pad_to(256);
    assert!(invalid_msg(r.parse()).contains("duplicate"));
}

#[test]
fn invalid_utf8_key_is_an_error_value_is_replaced() {
    let mut r = Raw::header(3, 0, 1).u64(2);
    r.0.extend_from_slice(&[0xff, 0xfe]);
    assert!(invalid_msg(r.u32(4).u32(1).parse()).contains("UTF-8"));
    let mut r = Raw::header(3, 0, 1).str("k").u32(8).u64(2);
    r.0.extend_from_slice(&[b'a', 0xff]);
    let f = r.parse().expect("lossy value");
    assert_eq!(f.get_str("k").ok(), Some("a\u{fffd}"));
}

#[test]
fn missing_tensor_lookup() {
    let f = GgufFile::from_bytes(sample()).expect("parse");
    match f.tensor("blk.0.attn_q.weight") {
        Err(EngineError::MissingTensor(name)) => assert_eq!(name, "blk.0.attn_q.weight"),
        other => panic!("expected MissingTensor, got {other:?}"),
    }
    assert!(f.tensor_info("nope").is_none());
}
