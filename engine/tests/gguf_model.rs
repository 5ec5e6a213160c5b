//! The real SmolLM2-135M-Instruct Q4_1 GGUF, located through the
//! `SPINDLE_MODEL_GGUF` environment variable; the tests fail when it is
//! unset or names another file (`scripts/test.sh` fetches it). Expected values come from the `gguf` Python package's
//! reader (`fixtures/dequant/smollm2_q4_1.json`, made by
//! `tools/reference/make_dequant_fixtures.py`).


use spindle_engine::gguf::GgufFile;
use spindle_engine::quant::{dequantize_row, dequantize_tensor};
use spindle_engine::weights::TensorSource;

const FIXTURE: &str = include_str!("fixtures/dequant/smollm2_q4_1.json");

fn fixture() -> serde_json::Value {
    serde_json::from_str(FIXTURE).expect("fixture is JSON")
}

/// The model; the test fails when it is not the fixture's file.
fn model() -> GgufFile {
    let path = spindle_testenv::smollm2_gguf();
    let expected = fixture()["file"].as_str().expect("file").to_owned();
    assert_eq!(path.file_name().and_then(|n| n.to_str()), Some(expected.as_str()), "SPINDLE_MODEL_GGUF must be {expected}");
    GgufFile::open(&path).expect("model parses")
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    let items = v.as_array().expect("array");
    items
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

#[test]
fn header_and_metadata() {
    let f = model();
    let fx = fixture();
    assert_eq!(f.version(), 3);
    assert_eq!(f.tensor_infos().len(), 272);
    assert_eq!(f.get_u64("llama.block_count").ok(), Some(30));
    assert_eq!(f.get_u64("llama.embedding_length").ok(), Some(576));
    let tokens = f.get_array("tokenizer.ggml.tokens").expect("tokens");
    assert_eq!(tokens.len(), 49152);
    assert_eq!(
        f.get_str("general.architecture").ok(),
        fx["architecture"].as_str()
    );
    assert_eq!(Some(f.alignment()), fx["alignment"].as_u64());
    assert_eq!(Some(f.data_offset()), fx["data_offset"].as_u64());
    assert_eq!(
        f.get_f64("llama.rope.freq_base").ok(),
        fx["rope_freq_base"].as_f64()
    );
    let eps = f
        .get_f64("llama.attention.layer_norm_rms_epsilon")
        .expect("eps");
    assert_eq!(Some(eps), fx["rms_eps"].as_f64());
    let first: Vec<&str> = tokens.iter().take(4).filter_map(|t| t.as_str()).collect();
    let want: Vec<&str> = fx["first_tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .filter_map(|t| t.as_str())
        .collect();
    assert_eq!(first, want);
    let merges = f.get_array("tokenizer.ggml.merges").expect("merges").len();
    assert_eq!(Some(merges as u64), fx["merges_count"].as_u64());
}

#[test]
fn tensors_match_python_reader() {
    let f = model();
    let fx = fixture();
    for t in fx["tensors"].as_array().expect("tensors") {
        let name = t["name"].as_str().expect("name");
        let info = f.tensor_info(name).expect("tensor present");
        assert_eq!(
            format!("{:?}", info.dtype).replace('K', "_K"),
            t["type"].as_str().expect("type")
        );
        let shape: Vec<usize> = t["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|d| d.as_u64().expect("dim") as usize)
            .collect();
        assert_eq!(info.shape, shape, "{name}");
        assert_eq!(Some(info.offset), t["offset"].as_u64(), "{name}");
        assert_eq!(Some(info.size as u64), t["size"].as_u64(), "{name}");

        let view = f.tensor(name).expect("view");
        let all = dequantize_tensor(&view).expect("dequantize");
        assert_eq!(all[..8], floats(&t["first8"])[..], "{name} first8");
        assert_eq!(
            all[all.len() - 8..],
            floats(&t["last8"])[..],
            "{name} last8"
        );
        let row1 = floats(&t["row1_first8"]);
        if !row1.is_empty() {
            let mut row = vec![0.0; shape[1]];
            dequantize_row(&view, 1, &mut row).expect("row 1");
            assert_eq!(row[..8], row1[..], "{name} row 1");
        }
    }
}

#[test]
fn every_tensor_is_in_bounds_and_dequantizes() {
    let f = model();
    for info in f.tensor_infos() {
        let view = f.tensor(&info.name).expect("view");
        assert_eq!(
            view.data.len(),
            info.dtype.bytes_for(view.numel()).expect("size")
        );
        let values = dequantize_tensor(&view).expect("dequantize");
        assert!(
            values.iter().all(|v| v.is_finite()),
            "{} has non-finite values",
            info.name
        );
    }
}
