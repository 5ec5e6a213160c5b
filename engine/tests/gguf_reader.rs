//! GGUF reader round trips through the in-memory writer: every metadata value
//! type, tensor infos, shapes, offsets, alignment, accessors, mmap opening.

use spindle_engine::gguf::types::GgmlType;
use spindle_engine::gguf::{GgufFile, GgufWriter, MetadataValue as V};
use spindle_engine::weights::TensorSource;
use spindle_engine::EngineError;

fn all_metadata() -> Vec<(&'static str, V)> {
    vec![
        ("general.architecture", V::String("llama".into())),
        ("t.u8", V::U8(200)),
        ("t.i8", V::I8(-100)),
        ("t.u16", V::U16(60000)),
        ("t.i16", V::I16(-30000)),
        ("t.u32", V::U32(4_000_000_000)),
        ("t.i32", V::I32(-2_000_000_000)),
        ("t.f32", V::F32(1.5e-5)),
        ("t.bool", V::Bool(true)),
        ("t.string", V::String("héllo ✓".into())),
        ("t.u64", V::U64(u64::MAX)),
        ("t.i64", V::I64(i64::MIN)),
        ("t.f64", V::F64(-2.25)),
        ("t.empty_string", V::String(String::new())),
        (
            "t.arr_i32",
            V::Array(vec![V::I32(1), V::I32(-2), V::I32(3)]),
        ),
        (
            "t.arr_str",
            V::Array(vec![V::String("a".into()), V::String("<0x0A>".into())]),
        ),
        ("t.arr_empty", V::Array(vec![])),
        (
            "t.arr_nested",
            V::Array(vec![
                V::Array(vec![V::F64(1.0), V::F64(2.0)]),
                V::Array(vec![]),
                V::Array(vec![V::F64(3.0)]),
            ]),
        ),
    ]
}

fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    for (k, v) in all_metadata() {
        w.add_metadata(k, v);
    }
    let f32s: Vec<u8> = (0..6)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    let q4: Vec<u8> = (0..2 * 18).map(|i| i as u8).collect();
    let q6: Vec<u8> = (0..210).map(|i| (i * 7) as u8).collect();
    w.add_tensor("a.f32", GgmlType::F32, &[2, 3], f32s)
        .expect("f32");
    w.add_tensor("b.q4_0", GgmlType::Q4_0, &[2, 32], q4)
        .expect("q4_0");
    w.add_tensor("c.q6_k", GgmlType::Q6K, &[256], q6)
        .expect("q6_k");
    w.add_tensor("d.scalar", GgmlType::F16, &[], vec![0x00, 0x3c])
        .expect("scalar");
    w
}

fn sample_bytes() -> Vec<u8> {
    sample_writer().to_bytes().expect("serialize")
}

#[test]
fn metadata_round_trips_every_type() {
    let f = GgufFile::from_bytes(sample_bytes()).expect("parse");
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.metadata().len(), all_metadata().len());
    for (k, v) in all_metadata() {
        assert_eq!(f.get(k), Some(&v), "{k}");
    }
}

#[test]
fn typed_accessors() {
    let f = GgufFile::from_bytes(sample_bytes()).expect("parse");
    assert_eq!(f.get_str("general.architecture").ok(), Some("llama"));
    assert_eq!(f.get_u64("t.u8").ok(), Some(200));
    assert_eq!(f.get_u64("t.u32").ok(), Some(4_000_000_000));
    assert_eq!(f.get_u64("t.u64").ok(), Some(u64::MAX));
    assert!(f.get_u64("t.i8").is_err(), "negative is not a u64");
    assert_eq!(f.get_f64("t.f64").ok(), Some(-2.25));
    assert_eq!(f.get_f64("t.f32").ok(), Some(f64::from(1.5e-5f32)));
    assert_eq!(f.get_f64("t.i32").ok(), Some(-2e9));
    assert_eq!(f.get("t.i64").and_then(V::as_i64), Some(i64::MIN));
    assert_eq!(f.get("t.bool").and_then(V::as_bool), Some(true));
    assert_eq!(
        f.get("t.arr_str").and_then(V::as_array).map(<[V]>::len),
        Some(2)
    );
    match f.get_str("t.u8") {
        Err(EngineError::InvalidGguf(m)) => assert!(m.contains("t.u8"), "{m}"),
        other => panic!("expected InvalidGguf, got {other:?}"),
    }
    assert!(matches!(
        f.get_str("nope"),
        Err(EngineError::InvalidGguf(_))
    ));
    assert!(matches!(
        f.get_u64("t.string"),
        Err(EngineError::InvalidGguf(_))
    ));
    assert!(matches!(
        f.get_f64("t.bool"),
        Err(EngineError::InvalidGguf(_))
    ));
}

#[test]
fn tensor_infos_and_data() {
    let bytes = sample_bytes();
    let f = GgufFile::from_bytes(bytes.clone()).expect("parse");
    let infos = f.tensor_infos();
    let names: Vec<&str> = infos.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a.f32", "b.q4_0", "c.q6_k", "d.scalar"]);
    assert_eq!(infos[0].shape, [2, 3]);
    assert_eq!(infos[0].size, 24);
    assert_eq!(infos[1].shape, [2, 32]);
    assert_eq!(infos[1].dtype, GgmlType::Q4_0);
    assert_eq!(infos[1].size, 36);
    assert_eq!(infos[2].shape, [256]);
    assert_eq!(infos[2].size, 210);
    assert_eq!(infos[3].shape, Vec::<usize>::new());
    assert_eq!(infos[3].size, 2);
    assert_eq!(f.data_offset() % 32, 0);
    for t in infos {
        assert_eq!(t.offset % 32, 0, "{}", t.name);
        assert!(t.offset >= f.data_offset());
    }
    let v = f.tensor("b.q4_0").expect("tensor");
    assert_eq!(
        v.data,
        (0..36).map(|i| i as u8).collect::<Vec<_>>().as_slice()
    );
    assert_eq!(v.shape, [2, 32]);
    assert_eq!(v.numel(), 64);
    let a = f.tensor("a.f32").expect("tensor");
    assert_eq!(&a.data[4..8], 0.5f32.to_le_bytes());
    let off = usize::try_from(infos[2].offset).expect("offset");
    assert_eq!(f.tensor("c.q6_k").expect("q6").data, &bytes[off..off + 210]);
    assert_eq!(f.tensor("d.scalar").expect("scalar").data, [0x00, 0x3c]);
    assert!(f.contains("c.q6_k"));
    assert!(!f.contains("c.q6"));
}

#[test]
fn custom_alignment_is_honoured() {
    let mut w = sample_writer();
    w.set_alignment(64);
    let f = GgufFile::from_bytes(w.to_bytes().expect("serialize")).expect("parse");
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    for t in f.tensor_infos() {
        assert_eq!(t.offset % 64, 0, "{}", t.name);
    }
    assert_eq!(f.tensor("a.f32").expect("t").data.len(), 24);
}

#[test]
fn version_2_is_accepted() {
    let mut b = sample_bytes();
    b[4..8].copy_from_slice(&2u32.to_le_bytes());
    let f = GgufFile::from_bytes(b).expect("v2 parses");
    assert_eq!(f.version(), 2);
    assert_eq!(f.tensor_infos().len(), 4);
}

#[test]
fn empty_file_without_tensors() {
    let b = GgufWriter::new().to_bytes().expect("serialize");
    let f = GgufFile::from_bytes(b).expect("parse");
    assert!(f.metadata().is_empty());
    assert!(f.tensor_infos().is_empty());
}

#[test]
fn open_maps_a_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("m.gguf");
    sample_writer().write_to(&path).expect("write");
    let f = GgufFile::open(&path).expect("open");
    assert_eq!(f.get_str("t.string").ok(), Some("héllo ✓"));
    assert_eq!(f.tensor("c.q6_k").expect("t").data.len(), 210);
    match GgufFile::open(&dir.path().join("missing.gguf")) {
        Err(EngineError::Io { path, .. }) => assert!(path.ends_with("missing.gguf")),
        other => panic!("expected Io, got {other:?}"),
    }
}

#[test]
fn writer_rejects_bad_tensors() {
    let mut w = GgufWriter::new();
    assert!(w
        .add_tensor("x", GgmlType::Q4_0, &[32], vec![0; 17])
        .is_err());
    assert!(w
        .add_tensor("x", GgmlType::Q4_0, &[16], vec![0; 9])
        .is_err());
    assert!(w
        .add_tensor("x", GgmlType::F32, &[1, 1, 1, 1, 1], vec![0; 4])
        .is_err());
    assert!(w.add_tensor("x", GgmlType::F32, &[1], vec![0; 4]).is_ok());
    assert!(
        w.add_tensor("x", GgmlType::F32, &[1], vec![0; 4]).is_err(),
        "duplicate"
    );
    w.add_metadata("bad", V::Array(vec![V::U8(1), V::I8(1)]));
    assert!(w.to_bytes().is_err(), "mixed-type array");
    let mut w = GgufWriter::new();
    w.set_alignment(48);
    assert!(w.to_bytes().is_err(), "alignment not a power of two");
}
