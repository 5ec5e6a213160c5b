//! Tests of the tiny random model writer and the make-tiny-model binary.

use std::path::Path;

use spindle_engine::gguf::types::GgmlType;
use spindle_engine::hf::HfModelDir;
use spindle_engine::weights::TensorSource;
use spindle_tools::tiny_model::{
    write_tiny_model, TinyArch, TinyDtype, TinyModelOptions, ENDOFTEXT_ID, IM_END_ID, IM_START_ID,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const FILES: [&str; 5] = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
];

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("reading {name}: {e}"))
}

#[test]
fn same_seed_gives_identical_files() -> TestResult {
    for arch in [TinyArch::Llama, TinyArch::Qwen3] {
        let (a, b, c) = (
            tempfile::tempdir()?,
            tempfile::tempdir()?,
            tempfile::tempdir()?,
        );
        let o = TinyModelOptions {
            seed: 7,
            dtype: TinyDtype::Bf16,
            ..TinyModelOptions::new(arch)
        };
        write_tiny_model(&o, a.path())?;
        write_tiny_model(&o, b.path())?;
        write_tiny_model(
            &TinyModelOptions {
                seed: 8,
                ..o.clone()
            },
            c.path(),
        )?;
        for f in FILES {
            assert_eq!(
                read(a.path(), f),
                read(b.path(), f),
                "{f} differs for the same seed"
            );
        }
        assert_ne!(
            read(a.path(), "model.safetensors"),
            read(c.path(), "model.safetensors")
        );
        assert_eq!(
            read(a.path(), "tokenizer.json"),
            read(c.path(), "tokenizer.json")
        );
    }
    Ok(())
}

fn check_shapes(m: &HfModelDir, o: &TinyModelOptions, dtype: GgmlType) -> TestResult {
    let (h, hd) = (o.hidden, o.head_dim());
    let t = |name: &str| m.tensor(name);
    assert_eq!(t("model.embed_tokens.weight")?.shape, vec![o.vocab, h]);
    assert_eq!(t("model.norm.weight")?.shape, vec![h]);
    assert_eq!(m.contains("lm_head.weight"), !o.tie_word_embeddings);
    for i in 0..o.layers {
        let p = format!("model.layers.{i}");
        assert_eq!(
            t(&format!("{p}.self_attn.q_proj.weight"))?.shape,
            vec![o.heads * hd, h]
        );
        assert_eq!(
            t(&format!("{p}.self_attn.k_proj.weight"))?.shape,
            vec![o.kv_heads * hd, h]
        );
        assert_eq!(
            t(&format!("{p}.self_attn.v_proj.weight"))?.shape,
            vec![o.kv_heads * hd, h]
        );
        assert_eq!(
            t(&format!("{p}.self_attn.o_proj.weight"))?.shape,
            vec![h, o.heads * hd]
        );
        assert_eq!(
            t(&format!("{p}.mlp.gate_proj.weight"))?.shape,
            vec![o.intermediate, h]
        );
        assert_eq!(
            t(&format!("{p}.mlp.up_proj.weight"))?.shape,
            vec![o.intermediate, h]
        );
        assert_eq!(
            t(&format!("{p}.mlp.down_proj.weight"))?.shape,
            vec![h, o.intermediate]
        );
        assert_eq!(t(&format!("{p}.input_layernorm.weight"))?.shape, vec![h]);
        assert_eq!(
            t(&format!("{p}.post_attention_layernorm.weight"))?.shape,
            vec![h]
        );
        let qk_norm = o.arch == TinyArch::Qwen3;
        assert_eq!(m.contains(&format!("{p}.self_attn.q_norm.weight")), qk_norm);
        if qk_norm {
            assert_eq!(t(&format!("{p}.self_attn.k_norm.weight"))?.shape, vec![hd]);
        }
    }
    for name in m.tensor_names() {
        assert_eq!(m.tensor(name)?.dtype, dtype, "{name}");
    }
    Ok(())
}

fn f32_values(m: &HfModelDir, name: &str) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
    let t = m.tensor(name)?;
    assert_eq!(t.dtype, GgmlType::F32);
    Ok(t.data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

#[test]
fn loads_with_the_hf_loader() -> TestResult {
    let cases = [
        (TinyArch::Llama, TinyDtype::F32, GgmlType::F32, false),
        (TinyArch::Qwen3, TinyDtype::Bf16, GgmlType::BF16, true),
        (TinyArch::Llama, TinyDtype::F16, GgmlType::F16, true),
    ];
    for (arch, dtype, ggml, tie) in cases {
        let dir = tempfile::tempdir()?;
        let o = TinyModelOptions {
            dtype,
            tie_word_embeddings: tie,
            ..TinyModelOptions::new(arch)
        };
        write_tiny_model(&o, dir.path())?;
        let m = HfModelDir::open(dir.path())?;
        let expected_arch = if arch == TinyArch::Llama {
            "LlamaForCausalLM"
        } else {
            "Qwen3ForCausalLM"
        };
        assert_eq!(m.architecture(), Some(expected_arch));
        assert_eq!(m.config_u64("vocab_size"), Some(320));
        assert_eq!(m.config_u64("head_dim"), Some(16));
        assert_eq!(m.config_bool("tie_word_embeddings"), Some(tie));
        assert_eq!(m.bos_token(), Some("<|endoftext|>"));
        assert_eq!(m.eos_token(), Some("<|im_end|>"));
        assert_eq!(m.eos_token_ids(), vec![IM_END_ID, ENDOFTEXT_ID]);
        assert!(m
            .chat_template()
            .is_some_and(|t| t.contains("<|im_start|>")));
        assert!(m.generation_defaults().sampling_params().validate().is_ok());
        check_shapes(&m, &o, ggml)?;
    }
    Ok(())
}

#[test]
fn weights_have_sane_magnitudes() -> TestResult {
    let dir = tempfile::tempdir()?;
    let o = TinyModelOptions::default();
    write_tiny_model(&o, dir.path())?;
    let m = HfModelDir::open(dir.path())?;
    let stats = |v: &[f32]| {
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / v.len() as f32;
        (mean, var.sqrt())
    };
    let (mean, std) = stats(&f32_values(&m, "model.layers.0.self_attn.q_proj.weight")?);
    assert!(
        mean.abs() < 0.01 && (0.02..=0.1).contains(&std),
        "q_proj {mean} {std}"
    );
    let (mean, std) = stats(&f32_values(&m, "model.layers.1.input_layernorm.weight")?);
    assert!((mean - 1.0).abs() < 0.05 && std < 0.1, "norm {mean} {std}");
    assert!(f32_values(&m, "lm_head.weight")?
        .iter()
        .all(|x| x.is_finite() && x.abs() < 1.0));
    Ok(())
}

#[test]
fn sharded_output_matches_single_file() -> TestResult {
    let (one, three) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let o = TinyModelOptions {
        arch: TinyArch::Qwen3,
        seed: 3,
        ..TinyModelOptions::default()
    };
    write_tiny_model(&o, one.path())?;
    write_tiny_model(
        &TinyModelOptions {
            shards: 3,
            ..o.clone()
        },
        three.path(),
    )?;
    let (a, b) = (
        HfModelDir::open(one.path())?,
        HfModelDir::open(three.path())?,
    );
    assert_eq!(b.safetensors_paths().count(), 3);
    assert!(three.path().join("model.safetensors.index.json").is_file());
    assert!(three
        .path()
        .join("model-00003-of-00003.safetensors")
        .is_file());
    assert!(a.tensor_names().eq(b.tensor_names()));
    for name in a.tensor_names() {
        assert_eq!(a.tensor(name)?.data, b.tensor(name)?.data, "{name}");
    }
    // Rewriting the sharded directory as a single file drops the old shards.
    write_tiny_model(&o, three.path())?;
    assert!(!three.path().join("model.safetensors.index.json").exists());
    assert_eq!(
        HfModelDir::open(three.path())?.safetensors_paths().count(),
        1
    );
    Ok(())
}

#[test]
fn tokenizer_round_trips_and_knows_specials() -> TestResult {
    let dir = tempfile::tempdir()?;
    let o = TinyModelOptions {
        vocab: 400,
        ..TinyModelOptions::default()
    };
    write_tiny_model(&o, dir.path())?;
    let tok = tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json"))
        .map_err(|e| format!("load: {e}"))?;
    assert_eq!(tok.get_vocab_size(true), 400);
    let enc = tok
        .encode("hello world", false)
        .map_err(|e| format!("{e}"))?;
    assert_eq!(enc.get_tokens(), &["hello", "Ġworld"]);
    for text in ["The quick brown fox,\n\tjumps!", "héllo 世界 🙂", ""] {
        let ids = tok
            .encode(text, false)
            .map_err(|e| format!("{e}"))?
            .get_ids()
            .to_vec();
        assert!(ids.iter().all(|&id| (id as usize) < 400));
        assert_eq!(tok.decode(&ids, false).map_err(|e| format!("{e}"))?, text);
    }
    let enc = tok
        .encode("<|im_start|>user\nhi<|im_end|>", false)
        .map_err(|e| format!("{e}"))?;
    let ids = enc.get_ids();
    assert_eq!((ids[0], ids[ids.len() - 1]), (IM_START_ID, IM_END_ID));
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(ENDOFTEXT_ID));
    assert_eq!(tok.id_to_token(399).as_deref(), Some("<|reserved_120|>"));
    Ok(())
}

#[test]
fn chat_template_renders_chatml() -> TestResult {
    let dir = tempfile::tempdir()?;
    write_tiny_model(&TinyModelOptions::default(), dir.path())?;
    let m = HfModelDir::open(dir.path())?;
    let template = m.chat_template().ok_or("no template")?;
    let mut env = minijinja::Environment::new();
    env.add_template("chat", template)?;
    use minijinja::context;
    let messages = vec![
        context! { role => "system", content => "Be brief." },
        context! { role => "user", content => "Hi" },
    ];
    let out = env
        .get_template("chat")?
        .render(context! { messages => messages, add_generation_prompt => true })?;
    let expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(out, expected);
    Ok(())
}

#[test]
fn bad_options_are_rejected() {
    let bad = [
        TinyModelOptions {
            kv_heads: 3,
            ..TinyModelOptions::default()
        },
        TinyModelOptions {
            vocab: 100,
            ..TinyModelOptions::default()
        },
        TinyModelOptions {
            hidden: 60,
            heads: 8,
            kv_heads: 2,
            ..TinyModelOptions::default()
        },
        TinyModelOptions {
            head_dim: Some(15),
            ..TinyModelOptions::default()
        },
        TinyModelOptions {
            shards: 0,
            ..TinyModelOptions::default()
        },
    ];
    for o in bad {
        assert!(o.validate().is_err(), "{o:?}");
    }
    let custom_head = TinyModelOptions {
        hidden: 48,
        heads: 4,
        head_dim: Some(16),
        ..TinyModelOptions::default()
    };
    assert!(custom_head.validate().is_ok());
}

#[test]
fn binary_writes_a_loadable_model() -> TestResult {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("tiny");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_make-tiny-model"))
        .args([
            "--arch", "qwen3", "--seed", "5", "--dtype", "bf16", "--layers", "3",
        ])
        .args([
            "--hidden",
            "32",
            "--heads",
            "4",
            "--kv-heads",
            "1",
            "--intermediate",
            "48",
        ])
        .args(["--vocab", "300", "--tie-embeddings", "--out"])
        .arg(&out)
        .status()?;
    assert!(status.success());
    let m = HfModelDir::open(&out)?;
    assert_eq!(m.config_u64("num_hidden_layers"), Some(3));
    assert_eq!(m.config_u64("head_dim"), Some(8));
    assert_eq!(m.config_str("torch_dtype"), Some("bfloat16"));
    let o = TinyModelOptions {
        arch: TinyArch::Qwen3,
        seed: 5,
        dtype: TinyDtype::Bf16,
        layers: 3,
        hidden: 32,
        kv_heads: 1,
        intermediate: 48,
        vocab: 300,
        tie_word_embeddings: true,
        ..TinyModelOptions::new(TinyArch::Qwen3)
    };
    check_shapes(&m, &o, GgmlType::BF16)?;
    // The library with the same options writes the same bytes.
    let lib = dir.path().join("lib");
    write_tiny_model(&o, &lib)?;
    for f in FILES {
        assert_eq!(read(&out, f), read(&lib, f), "{f}");
    }
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_make-tiny-model"))
        .args(["--arch", "llama", "--kv-heads", "3", "--out"])
        .arg(dir.path().join("bad"))
        .output()?;
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("kv-heads"));
    Ok(())
}
